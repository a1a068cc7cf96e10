"""pipeplan.models: the model zoo (built-in specs, Hugging Face configs, the character LM, datasets) and the stage
module; the runtime trains and the profiler measures the same layers. Imports torch."""
