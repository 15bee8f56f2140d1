"""Shared test settings."""

import torch

# One intra-op thread: on a loaded 2-core machine torch's thread pool makes the
# many tiny tensor operations of a lookup far slower, not faster.
torch.set_num_threads(1)
