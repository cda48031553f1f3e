"""Keras 3's built-in layers by class name (Keras 3.15's `keras.layers`), to tell a layer podkit
lacks that Keras ships from a class of the user's: registering a class of one's own stands in
for the latter only. A Keras 3 file says which a layer is (a built-in's `module` is
"keras.layers"); tf.keras 2's legacy `.h5` names no module, so its layers are looked up here.
tests/interop/test_keras_files.py checks both sets against Keras itself.
"""

from __future__ import annotations

#: under keras.src.layers.preprocessing: they transform the data (augmentation, resizing,
#: lookups, spectrograms), so they can run in the input pipeline instead of the model
PREPROCESSING = frozenset("""
    AugMix AutoContrast CategoryEncoding CenterCrop
    ContrastLimitedAdaptiveHistogramEqualization CutMix Discretization Equalization
    HashedCrossing Hashing IntegerLookup MaxNumBoundingBoxes MelSpectrogram MixUp
    Normalization Pipeline RandAugment RandomBrightness RandomColorDegeneration
    RandomColorJitter RandomContrast RandomCrop RandomElasticTransform RandomErasing
    RandomFlip RandomGaussianBlur RandomGrayscale RandomHue RandomInvert RandomPerspective
    RandomPosterization RandomRotation RandomSaturation RandomSharpness RandomShear
    RandomTranslation RandomZoom Rescaling Resizing STFTSpectrogram Solarization
    StringLookup TextVectorization
""".split())

#: every other layer class keras.layers exports (aliases such as MaxPool2D are written
#: under their class's name, MaxPooling2D)
OTHERS = frozenset("""
    Activation ActivityRegularization AdaptiveAveragePooling1D AdaptiveAveragePooling2D
    AdaptiveAveragePooling3D AdaptiveMaxPooling1D AdaptiveMaxPooling2D AdaptiveMaxPooling3D
    Add AdditiveAttention AlphaDropout Attention Average AveragePooling1D AveragePooling2D
    AveragePooling3D BatchNormalization Bidirectional Concatenate Conv1D Conv1DTranspose
    Conv2D Conv2DTranspose Conv3D Conv3DTranspose ConvLSTM1D ConvLSTM2D ConvLSTM3D
    Cropping1D Cropping2D Cropping3D Dense DepthwiseConv1D DepthwiseConv2D Dot Dropout ELU
    EinsumDense Embedding Flatten FlaxLayer GRU GRUCell GaussianDropout GaussianNoise
    GlobalAveragePooling1D GlobalAveragePooling2D GlobalAveragePooling3D GlobalMaxPooling1D
    GlobalMaxPooling2D GlobalMaxPooling3D GroupNormalization GroupedQueryAttention Identity
    InputLayer JaxLayer LSTM LSTMCell Lambda Layer LayerNormalization LeakyReLU Masking
    MaxPooling1D MaxPooling2D MaxPooling3D Maximum Minimum MultiHeadAttention Multiply PReLU
    Permute RMSNormalization RNN ReLU RepeatVector Reshape ReversibleEmbedding
    SeparableConv1D SeparableConv2D SimpleRNN SimpleRNNCell Softmax SpatialDropout1D
    SpatialDropout2D SpatialDropout3D SpectralNormalization StackedRNNCells Subtract
    TFSMLayer TimeDistributed TorchModuleWrapper UnitNormalization UpSampling1D UpSampling2D
    UpSampling3D Wrapper ZeroPadding1D ZeroPadding2D ZeroPadding3D
""".split())

LAYERS = PREPROCESSING | OTHERS


def is_builtin(entry: dict) -> bool:
    """Whether a serialized Keras layer is one of Keras's own: its module is Keras's
    ("keras.layers", "keras.src..."; keras_hub's "keras_hub..." is not), or, in a legacy file
    that names no module, its class name is one of Keras's."""
    module = entry.get("module")
    if "module" in entry:
        return isinstance(module, str) and (module == "keras" or module.startswith("keras."))
    return entry.get("class_name") in LAYERS
