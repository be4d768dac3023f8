"""Attention paths: a finite-width statistical-mechanics theory of multi-head attention networks.

Chapter 4 (``04-attention-paths``) derives everything in this package. The model is a stack of
``L`` attention layers whose heads are *summed*; every attention matrix is a fixed function of the
bare input, so the network is a deep *linear* network in its trained weights. Unrolling it gives
one term per *attention path* (one head per layer). Bayesian learning of the value weights at
finite width ``N`` with ``P = alpha N`` examples is then exactly a Gaussian process with a
*renormalised* kernel

.. math:: K(x, x') = \\sum_{\\pi\\pi'} U_{\\pi\\pi'} C_{\\pi\\pi'}(x, x'),

where ``C`` are fixed path-path kernels and the order parameter ``U`` minimises an action.

Conventions (used everywhere, tests included):

* a sequence is a tensor ``(tokens, N0)``; a batch is ``(batch, tokens, N0)``;
* attention tensors are ``(batch, heads, key s, query t)``, normalised over the key axis;
* ``heads = [H_1, ..., H_L]``; ``widths = [N_1, ..., N_L, N_a]`` (``N_l`` is the *input* width
  of attention layer ``l``); ``variances = [s0^2, s1^2, ..., sL^2, sa^2]``;
* paths are flattened with the head of layer 1 as the slowest index;
* the temperature is ``T``; the number of tokens is ``n_tok``.

Modules (every public name is re-exported here: ``from attnlib import paths``):

* :mod:`.model` -- attention from the bare input, the forward pass, the path expansion;
* :mod:`.kernels` -- path-path kernels, the renormalised kernel, the predictor, alignment, head scores;
* :mod:`.action` -- the action over the order parameters and its solvers;
* :mod:`.sampling` -- the Gibbs posterior of the weights and a Hamiltonian Monte Carlo sampler;
* :mod:`.markov` -- the hidden-Markov-chain task with hand-designed heads;
* :mod:`.images` -- one-shot in-context glyph episodes and the gradient-descent network.
"""

from .action import (
    ActionSolution,
    PathAction,
    adam_raw_solve,
    compare_solvers,
    gp_order_parameters,
    solve_to_tolerance,
    ua_closed_form,
)
from .images import (
    Episodes,
    ICLAttentionNet,
    ImageTaskConfig,
    image_task_episodes,
    learning_rate,
    make_episodes,
    patch_tokens,
    train_icl_net,
    train_icl_nets,
)
from .kernels import (
    accuracy,
    head_scores,
    kernel_alignment,
    kernel_diagonal,
    kernel_target_alignment,
    path_kernels,
    predict,
    renormalised_kernel,
    scaled_features,
    top_pc_label_fraction,
)
from .markov import (
    PATH_NAMES_4,
    MarkovTaskConfig,
    make_markov_data,
    markov_attention,
    markov_heads,
    markov_problem,
)
from .model import DTYPE as DTYPE  # float64, the dtype of every theory computation
from .model import (
    attention_from_bilinear,
    effective_path_weights,
    forward,
    init_weights,
    path_features,
    path_forward,
    path_overlap,
    readout_vector,
)
from .sampling import HMCResult, PathPosterior, hmc

__all__ = [
    # model
    "attention_from_bilinear",
    "readout_vector",
    "init_weights",
    "forward",
    "path_features",
    "effective_path_weights",
    "path_overlap",
    "path_forward",
    # kernels and theory
    "scaled_features",
    "path_kernels",
    "renormalised_kernel",
    "kernel_diagonal",
    "gp_order_parameters",
    "ua_closed_form",
    "PathAction",
    "ActionSolution",
    "predict",
    "accuracy",
    "kernel_alignment",
    "top_pc_label_fraction",
    "kernel_target_alignment",
    "head_scores",
    "adam_raw_solve",
    "solve_to_tolerance",
    # hidden-Markov-chain task
    "MarkovTaskConfig",
    "make_markov_data",
    "markov_heads",
    "markov_attention",
    "PATH_NAMES_4",
    "markov_problem",
    "compare_solvers",
    # posterior sampling
    "hmc",
    "HMCResult",
    "PathPosterior",
    # one-shot image task (glyphs)
    "ImageTaskConfig",
    "Episodes",
    "patch_tokens",
    "make_episodes",
    "image_task_episodes",
    "ICLAttentionNet",
    "train_icl_net",
    "train_icl_nets",
    "learning_rate",
]
