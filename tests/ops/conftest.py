"""Tiny-model tests run single-threaded: their tensors are far too small to gain from threads, and on a
shared machine intra-op threads spin-wait (a 30x slowdown under load)."""

import torch

torch.set_num_threads(1)
