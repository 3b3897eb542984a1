from .module import Module, Sequential, count_params, param_bytes
from .linear import Linear
from .activations import GeLU
from .layernorm import LayerNorm
from .embedding import Embedding
from .attention import CausalSelfAttention
from .mlp import MLP, mlp_model
from .gpt import GPT, TransformerBlock
from .losses import cross_entropy, mse
from .optim import SGD, Adam
from .flat import FlatBuffer, flatten
