"""The spec's closed vocabularies: ``str`` enums that read the names users bring from the frameworks
(``pytorch``, ``mixed_float16``, ``Dense``) and suggest the closest name for a typo."""

from __future__ import annotations

import difflib
import enum
from typing import Any, TypeVar

from dualtrain.errors import UserError, shown

_E = TypeVar("_E", bound="StrEnum")


class StrEnum(str, enum.Enum):
    """A closed vocabulary whose members are plain strings (JSON/YAML friendly)."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> list[str]:
        return [m.value for m in cls]

    @classmethod
    def parse(cls: type[_E], value: Any, path: str) -> _E:
        """The member ``value`` names: its value in any letter case, or an unambiguous alias the
        frameworks use (``pytorch``, ``mixed_float16``, ``Dense``, ``linear``); recorded by its
        canonical value. Otherwise a UserError that suggests the closest names."""
        if isinstance(value, str):
            key = value.strip().lower()
            if key in cls.values():
                return cls(key)
            alias = ALIASES.get(cls.__name__, {}).get(key.replace("-", "_"))
            if alias is not None:
                return cls(alias)
            close = difflib.get_close_matches(
                key, cls.values() + list(ALIASES.get(cls.__name__, {})), n=2, cutoff=0.6
            )
            names = [ALIASES.get(cls.__name__, {}).get(c, c) for c in close]
            if names:
                hint = " or ".join(f"'{n}'" for n in dict.fromkeys(names))
                raise UserError(
                    f"{path} must be one of {cls.values()}; did you mean {hint}? "
                    f"Received: {value!r}"
                )
        raise UserError(f"{path} must be one of {cls.values()}. Received: {shown(value)}")


#: Names users bring from the frameworks, per vocabulary (keys lower case, "-" read as "_").
ALIASES: dict[str, dict[str, str]] = {
    "Backend": {"pytorch": "torch", "tensorflow": "tf", "keras": "tf"},
    "Precision": {
        "float32": "fp32",
        "single": "fp32",
        "float16": "fp16",
        "half": "fp16",
        "mixed_float16": "fp16",
        "bfloat16": "bf16",
        "mixed_bfloat16": "bf16",
        "float64": "fp64",
        "double": "fp64",
    },
    "LayerType": {
        "linear": "dense",
        "conv2d": "conv2d",
        "conv": "conv2d",
        "maxpooling2d": "maxpool2d",
        "maxpool": "maxpool2d",
        "averagepooling2d": "avgpool2d",
        "avgpool": "avgpool2d",
        "globalaveragepooling2d": "global_avgpool",
        "adaptiveavgpool2d": "global_avgpool",
        "batchnormalization": "batchnorm",
        "batchnorm2d": "batchnorm",
        "batchnorm1d": "batchnorm",
        "syncbatchnorm": "batchnorm",
        "layernormalization": "layernorm",
        "multiheadattention": "attention",
        "multihead_attention": "attention",
        "self_attention": "attention",
        "patch_embedding": "patches",
        "position_embedding": "position",
        "positional_embedding": "position",
        "tokenpool": "token_pool",
        "swish": "silu",
    },
    "TokenPool": {"cls": "first", "average": "mean"},
    "ScheduleName": {
        "cosineannealing": "cosine",
        "cosineannealinglr": "cosine",
        "cosinedecay": "cosine",
        "steplr": "step",
    },
}


class Backend(StrEnum):
    TORCH = "torch"
    TF = "tf"


class Precision(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    #: float64 parameters, activations, loss and optimizer state: the reference precision
    FP64 = "fp64"

    @property
    def param_dtype(self) -> str:
        """NumPy name of the parameters' (and optimizer state's) dtype: float64 for fp64, else
        float32 (fp16/bf16 keep float32 master weights)."""
        return "float64" if self is Precision.FP64 else "float32"


class LastBatch(StrEnum):
    DROP = "drop"
    KEEP = "keep"


class Sharding(StrEnum):
    #: every sample exactly once per epoch, contiguous balanced split of each global batch
    EXACT = "exact"
    #: torch.utils.data.DistributedSampler + DataLoader, padding and rank striding included
    TORCH_SAMPLER = "torch_sampler"


class OptimizerName(StrEnum):
    """The optimizers by name, each with torch.optim's semantics on both backends; what each takes
    and keeps is declared in dualtrain.spec.optimizers.OPTIMIZERS."""

    #: stochastic gradient descent, with torch's momentum, Nesterov momentum and L2 weight decay
    SGD = "sgd"
    #: Adam: bias-corrected running averages of the gradient and of its square; weight decay is L2
    #: added to the gradient
    ADAM = "adam"
    #: Adam with decoupled weight decay: the weights shrink by lr x weight_decay each step
    ADAMW = "adamw"
    #: Adam's variant on the infinity norm: the step divides by a decaying maximum of abs(g)
    ADAMAX = "adamax"
    #: Adadelta: the step is the gradient times the ratio of the running root mean squares of the
    #: updates and of the gradients, times lr
    ADADELTA = "adadelta"
    #: RMSprop: the gradient divided by the root of a running average of its square; optional
    #: momentum, and centered: less the square of the gradient's running average
    RMSPROP = "rmsprop"


class ScheduleName(StrEnum):
    CONSTANT = "constant"
    STEP = "step"
    COSINE = "cosine"


class ScheduleInterval(StrEnum):
    #: the lr changes every optimizer step (the default)
    STEP = "step"
    #: the lr changes once per epoch, as a torch scheduler stepped after each epoch
    EPOCH = "epoch"


class Device(StrEnum):
    CPU = "cpu"
    GPU = "gpu"


class Strategy(StrEnum):
    """How the replicas combine their gradients (docs/strategies.md): the same step either way."""

    #: every replica holds the weights; the gradients are all-reduced (SUM), every replica updates
    ALL_REDUCE = "all_reduce"
    #: a parameter-server process holds the weights and the optimizer; every replica sends it its
    #: gradient, the server sums them in replica order once all are in, updates once, and every
    #: replica takes the new weights (synchronous)
    PARAMETER_SERVER = "parameter_server"


class TFStrategy(StrEnum):
    MIRRORED = "mirrored"
    MULTI_WORKER = "multi_worker"


class LayerType(StrEnum):
    """The layer types of ``model.layers``; each one's fields and shape rule are declared in
    dualtrain.spec.layers.KINDS."""

    #: a fully connected layer, torch's nn.Linear and Keras's Dense; on tokens (T, D), per token
    DENSE = "dense"
    #: a 2-D convolution of a C,H,W image, torch's nn.Conv2d and Keras's Conv2D
    CONV2D = "conv2d"
    #: the maximum of each window, torch's nn.MaxPool2d and Keras's MaxPooling2D, no padding
    MAXPOOL2D = "maxpool2d"
    #: the mean of each window, torch's nn.AvgPool2d and Keras's AveragePooling2D, no padding
    AVGPOOL2D = "avgpool2d"
    #: C,H,W -> C: the mean over H and W, Keras's GlobalAveragePooling2D
    GLOBAL_AVGPOOL = "global_avgpool"
    #: any shape -> one axis, in the C,H,W order on both backends
    FLATTEN = "flatten"
    #: max(x, 0) elementwise, torch's nn.ReLU and Keras's ReLU
    RELU = "relu"
    #: tanh(x) elementwise, torch's nn.Tanh and Keras's tanh
    TANH = "tanh"
    #: 1 / (1 + exp(-x)) elementwise, torch's nn.Sigmoid and Keras's sigmoid
    SIGMOID = "sigmoid"
    #: x·sigmoid(x) elementwise, torch's nn.SiLU and Keras's silu
    SILU = "silu"
    #: the Gaussian error linear unit elementwise, torch's nn.GELU: the exact erf form, or its tanh
    #: approximation
    GELU = "gelu"
    #: zeroes elements at random in training and scales the rest by 1/(1-rate); the same mask on
    #: both backends; the identity in evaluation
    DROPOUT = "dropout"
    #: normalises each feature or channel by its batch's statistics and keeps running ones, as
    #: torch's BatchNorm1d and BatchNorm2d do, or SyncBatchNorm with sync
    BATCHNORM = "batchnorm"
    #: normalises the last axis of each sample, then a learned scale and shift: torch's
    #: nn.LayerNorm, Keras's LayerNormalization
    LAYERNORM = "layernorm"
    #: a ViT patch embedding: an image C,H,W -> tokens (T, dim), a token per patch, row by row
    PATCHES = "patches"
    #: adds a learned position embedding (T, D) to the tokens
    POSITION = "position"
    #: multi-head self-attention on tokens (T, D), with torch's nn.MultiheadAttention's parameters
    ATTENTION = "attention"
    #: tokens (T, D) -> (D,): their mean, or the first token
    TOKEN_POOL = "token_pool"
    #: integer ids (T,) -> tokens (T, dim), a learned table, torch's nn.Embedding and Keras's
    #: Embedding; only as the first layer
    EMBEDDING = "embedding"
    #: body(x) + shortcut(x): the shortcut's layers, or x itself where it has none
    RESIDUAL = "residual"
    #: the outputs of the input branches side by side, in model.inputs order; only as
    #: model.layers[0] of a model with several inputs
    CONCAT = "concat"


class Every(StrEnum):
    EPOCH = "epoch"


class StopMode(StrEnum):
    AUTO = "auto"
    MIN = "min"
    MAX = "max"


class Progress(StrEnum):
    AUTO = "auto"
    BAR = "bar"
    LINES = "lines"


class Approximate(StrEnum):
    """gelu's form: the exact erf form (torch's nn.GELU() and Keras's gelu default) or the tanh
    approximation (nn.GELU(approximate="tanh"), keras.activations.gelu(approximate=True))."""

    NONE = "none"
    TANH = "tanh"


class TokenPool(StrEnum):
    """token_pool: the mean over the tokens, or the first token (a class token's place)."""

    MEAN = "mean"
    FIRST = "first"


class Padding(StrEnum):
    VALID = "valid"
    SAME = "same"


class Dataset(StrEnum):
    """``mnist``; ``arrays`` (your own .npz or folder of .npy files, docs/data.md); ``table`` (your
    own CSV or Parquet table, one sample a row, converted once into cached arrays); or a dataset
    bundled inside scikit-learn's package (offline): ``digits`` (8x8 images, 10 classes), ``wine``
    (13 features, 3 classes), ``breast_cancer`` (30 features, 2 classes), ``diabetes`` (10
    features, a float target)."""

    MNIST = "mnist"
    ARRAYS = "arrays"
    TABLE = "table"
    DIGITS = "digits"
    WINE = "wine"
    BREAST_CANCER = "breast_cancer"
    DIABETES = "diabetes"


class Loss(StrEnum):
    """The losses by name; everything else about each (targets, outputs, its sum, metric and
    scale) is declared in dualtrain.core.losses.LOSSES."""

    CROSS_ENTROPY = "cross_entropy"
    BINARY_CROSS_ENTROPY = "binary_cross_entropy"
    MSE = "mse"
    HUBER = "huber"


#: The evaluation metric each loss is recorded with (beside the loss itself; its definition is
#: dualtrain.core.losses.metric_sum): the one place that names it.
METRICS: dict[Loss, str] = {
    Loss.CROSS_ENTROPY: "accuracy",
    Loss.BINARY_CROSS_ENTROPY: "accuracy",
    Loss.MSE: "mae",
    Loss.HUBER: "mae",
}


class Normalize(StrEnum):
    AUTO = "auto"
    NONE = "none"
