"""The probe's model: the Llama 3 modules, loading Hugging Face weights, starting from a checkpoint."""
