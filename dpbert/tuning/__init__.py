"""Hyperparameters without spending ε: the learning rate and clip norm of a planned DP-SGD run,
chosen on a PUBLIC proxy at a small batch with the noise on the mean gradient kept (TAN's rule).

``proxy`` builds the public text the tuner trains on (never the private corpus nor anything derived
from it); ``tune`` runs the grid with the shipped training loop (``dpbert.engine``) and
records the choice with its provenance. docs/training.md ("Choosing the learning rate and clip
norm without spending ε").
"""
