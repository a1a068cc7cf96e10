"""pipeplan.models.zoo: the models pipeplan ships (built-in specs, the character LM, the residual CNN, Hugging Face and stock
models) and their datasets."""
