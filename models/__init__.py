"""Model definitions, configs, weight loaders, audio and text front ends, and the model registry."""
