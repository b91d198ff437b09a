"""How good a detector is: evaluation, cross-validation, training.

How good a detector is: training recipes, held-out evaluation, grouped K-fold
cross-validation with fold checkpoints, paired comparisons, cross-domain matrices, a
set's quality with its experts, and the training loop behind ``ragscope train``."""
