"""Model definition, loaders, tokenizer and chat template."""
