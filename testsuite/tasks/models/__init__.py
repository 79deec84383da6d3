"""Small whole models: an MLP block, a transformer block, a small CNN and a mixture-of-experts layer."""
