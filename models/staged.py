"""What every model exposes: pipeline parallelism and activation checkpointing split it here."""
import torch
import torch.nn as nn


class StagedModel(nn.Module):
    """A stem, a ModuleList of stages and a head; pp prunes each (nn.Identity) to its own part."""
    stem: nn.Module
    stages: nn.ModuleList
    head: nn.Module

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        """Pool and classify the last stage's features (pipeline stages call it alone)."""
        raise NotImplementedError
