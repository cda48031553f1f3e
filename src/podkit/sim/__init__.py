"""The pod simulator: predict what a training step costs on a TPU pod or a GPU cluster.

`hardware` is the catalog of chips and pods, `collectives` the closed-form cost of each
collective and where a mesh's axes land on the links, `linksim` a link-level simulation of
small tori that checks the closed forms. Every catalog value's source: docs/sim-hardware.md.
`program` is what one device does in a train step, read from the program XLA compiles for a
mesh and scaled to a larger one; `analytic` the same from formulas, for transformers and
ResNet-50 too large to compile here. `step` estimates one step of a program on a pod
(`estimate`, with a chip's `Efficiency`), `plan` ranks every mesh of a pod for a model
(`sim.plan.plan(Transformer(...) | ResNet50() | Compiled(program), pod, global_batch)`). Guide:
docs/planner.md; accuracy: docs/sim-validation.md.
"""

from podkit.sim.analytic import resnet50 as resnet50
from podkit.sim.analytic import transformer as transformer
from podkit.sim.collectives import KINDS as KINDS
from podkit.sim.collectives import Cost as Cost
from podkit.sim.collectives import Group as Group
from podkit.sim.collectives import Layout as Layout
from podkit.sim.collectives import Tier as Tier
from podkit.sim.collectives import TorusDim as TorusDim
from podkit.sim.collectives import assign_axes as assign_axes
from podkit.sim.collectives import bus_factor as bus_factor
from podkit.sim.collectives import collective_time as collective_time
from podkit.sim.collectives import group as group
from podkit.sim.collectives import groups as groups
from podkit.sim.collectives import layout as layout
from podkit.sim.hardware import BUILTIN as BUILTIN
from podkit.sim.hardware import Chip as Chip
from podkit.sim.hardware import Pod as Pod
from podkit.sim.hardware import catalog as catalog
from podkit.sim.hardware import chip as chip
from podkit.sim.hardware import load_catalog as load_catalog
from podkit.sim.hardware import pod as pod
from podkit.sim.plan import Compiled as Compiled
from podkit.sim.plan import ResNet50 as ResNet50
from podkit.sim.plan import Transformer as Transformer
from podkit.sim.program import CollectiveOp as CollectiveOp
from podkit.sim.program import Program as Program
from podkit.sim.program import extract as extract
from podkit.sim.program import extract_model as extract_model
from podkit.sim.program import scale as scale
from podkit.sim.step import Efficiency as Efficiency
from podkit.sim.step import Estimate as Estimate
from podkit.sim.step import efficiency_for as efficiency_for
from podkit.sim.step import estimate as estimate
