"""Offline RL: datasets in Minari's format (``dataset``), the dataset as a source of Batches on the Trainer's loop
(``sampler``) and D4RL-style normalised scores (``scores``)."""
