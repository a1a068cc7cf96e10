"""pipeplan.models.traced: a model that is no chain, traced into layers (torch.fx, else torch.export) and run as graph stages."""
