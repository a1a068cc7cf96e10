"""pipeplan: plan, simulate and run pipeline-parallel training of large DNNs."""

__version__ = "0.1.0"
