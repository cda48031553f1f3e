"""The simulator against published results (bench/sim_validate.py, docs/sim-validation.md),
each case by what it checks: the held-out ones (no constant that moves their figure came from
their source: Ying et al.'s v3 pod and PaLM) within 10%; the ones a constant was set from as
calibration checks (Haiku's 64- and 512-chip runs, which are its 16-chip calibration row x
chips / 16, the 512-chip one with its own bound; MaxText 32B; the H100 bus bandwidth); what
the held-out labels rest on; the memory records and the v5e's compiled figures; the seed
question."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from podkit.sim import hardware as hw
from podkit.sim import step

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "sim_validate.py"


@pytest.fixture(scope="module")
def validate():
    spec = importlib.util.spec_from_file_location("sim_validate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def resnet(validate):
    return validate.resnet_v3()  # refits the v3 on Haiku's 16-chip run and checks the stored


def test_the_held_out_cases_are_within_10_percent(validate, resnet):
    ying, *_ = resnet
    for case in (ying, validate.palm_540b()):
        assert case["held_out"] and abs(case["error"]) <= 0.10, case


def test_haikus_64_chip_run_is_calibrated_on_its_16_chip_row_and_within_10_percent(resnet):
    # Not held out: its figure is the same README's 16-chip row (the v3's calibration point)
    # x 64 / 16, so +1.6% says Haiku's own run scaled linearly, not that the model predicts.
    haiku_64 = resnet[1]
    assert not haiku_64["held_out"] and "16-chip row" in haiku_64["basis"], haiku_64
    assert abs(haiku_64["error"]) <= 0.10, haiku_64


def test_haikus_512_chip_run_is_calibrated_and_20_to_26_percent_high(resnet):
    # +23.1%, kept with its own bound so that a change that moves it is seen. Not held out
    # (the 16-chip row x 512 / 16). A 5-minute run: the model's steady state would do the 90
    # epochs in 4.1 minutes; compile, input warm-up and the final evaluation are a larger
    # share of it than of the 33- and 130-minute runs, and the model predicts steady-state
    # throughput (a likely reason, not measured).
    haiku_512 = resnet[2]
    assert not haiku_512["held_out"] and 0.20 <= haiku_512["error"] <= 0.26, haiku_512


def test_the_held_out_cases_are_exactly_ying_et_al_and_palm(validate, resnet):
    rows = [*resnet, validate.maxtext_32b(), validate.palm_540b(), validate.h100_busbw()]
    held = [r["case"] for r in rows if r["primary"] and r["held_out"]]
    assert len(held) == 2 and "Ying et al." in held[0] and held[1].startswith("PaLM 540B")
    assert all(r["basis"].startswith("calibrated on:") for r in rows
               if r["primary"] and not r["held_out"])


def test_maxtext_32b_which_the_tpu_matmul_default_was_set_from_is_within_10_percent(
        validate):
    # Not held out: step.DEFAULTS["tpu"].matmul = 0.8 was set from MaxText's v5p MFU table,
    # which this row (71.47%) is in; -11.9% at 0.75, +2.5% at 0.9 (the sensitivity table).
    case = validate.maxtext_32b()
    assert not case["held_out"] and abs(case["error"]) <= 0.10, case


def test_h100_bus_bandwidth_is_within_1_percent_by_the_gpu_link_efficiency(validate):
    # Not held out: the GPU link efficiency (NCCL's 20.6 of 25 GB/s a link) came in with
    # this case; at 1.0 the row is +21.6%.
    case = validate.h100_busbw()
    assert not case["held_out"] and abs(case["error"]) <= 0.01, case
    plain = validate.h100_busbw(dataclasses.replace(step.DEFAULTS["gpu"], link=1.0))
    assert plain["error"] > 0.2


def test_the_v3_rows_are_haikus_16_chip_rate_times_the_chips(validate, resnet):
    # Why they test scaling from the 16-chip calibration point and nothing else: the gradient
    # all-reduce hides behind compute, so the conv efficiency alone sets the figure (and why
    # Haiku's own larger rows, from the same README as that point, are not held out).
    for case, chips in zip(resnet[:3], (1024, 64, 512), strict=True):
        assert case["exposed_communication_s"] == 0
        assert case["predicted"] == pytest.approx(validate.HAIKU_16_CHIPS * chips / 16,
                                                  rel=2e-3)


def test_palms_mfu_does_not_move_with_the_v4_dcn_bandwidth_taken_from_its_paper(validate):
    # The v4's DCN figure is PaLM's own (section 4); the cross-pod all-reduce hides behind
    # compute from a tenth of it to twice it, so the PaLM row stays held out for its MFU.
    base = validate.palm_540b()["error"]
    v4 = hw.chip("tpu-v4")
    for factor in (0.1, 2.0):
        chips = {**hw.catalog(), "tpu-v4": dataclasses.replace(
            v4, dcn_bandwidth=v4.dcn_bandwidth * factor)}
        assert validate.palm_540b(chips=chips)["error"] == pytest.approx(base, abs=1e-4)


def test_palm_fits_its_pod_as_it_ran_and_not_without_remat(validate):
    palm_full, palm_none, _maxtext = validate.fits()
    assert palm_full["ran"] and palm_full["fits"]
    assert not palm_none["ran"] and not palm_none["fits"]


def test_maxtext_32b_is_planned_not_to_fit_where_it_ran(validate):
    # The documented disagreement (docs/sim-validation.md): 98.5 GiB planned against 89.3
    # usable; XLA's own rematerialization, which would be how it ran, is not modelled. When
    # the model learns it, this test and the page change together.
    *_, maxtext = validate.fits()
    assert maxtext["ran"] and not maxtext["fits"]
    assert maxtext["memory_gib"] == pytest.approx(98.5, abs=0.05)


def test_the_config_twins_memory_at_their_microbatch_is_within_3_percent_of_a_v5es(validate):
    # GPT-124M's whole step at its microbatch of 16 (+1.3%), the Llama config's temporaries
    # (+1.8%); no memory term of the model is fitted.
    gpt_16, _gpt_32, llama = validate.compiled_memory()
    for case in (gpt_16, llama):
        assert abs(case["error"]) <= 0.03, case
    assert gpt_16["fits"]


def test_gpt_124m_in_one_microbatch_of_32_is_planned_5_percent_high_and_not_to_fit(validate):
    # A documented disagreement (docs/sim-validation.md): the calibration run compiled and ran
    # it in 14.81 GiB; the twin plans 15.59, above the 15.04 usable. Its activations grow by
    # 6.78 GiB per 16 sequences against the compiled 6.12; 0.28 GiB of that is the dropout
    # masks Korthikanti's formula counts, which podkit (dropout 0) does not keep.
    gpt_32 = validate.compiled_memory()[1]
    assert 0.04 <= gpt_32["error"] <= 0.07 and gpt_32["fits"] is False, gpt_32


def test_the_seed_question_turns_on_batchnorm_and_the_network(validate):
    rows = {(c["hardware"].split(",")[-1].strip(), c["batchnorm"]): c["scaling_efficiency"]
            for c in validate.seed_question()}
    assert rows[("TPU v4", "per chip")] == pytest.approx(1.0)
    assert rows[("InfiniBand (NDR/HDR per GPU)", "per chip")] > 0.95  # overlapped
    assert rows[("no overlap", "per chip")] < 0.7  # the 2018 GPU cluster
    assert rows[("TPU v4", "pod-wide")] < 0.75  # 106 exposed all-reduces a step
