"""A third-party kstrata pass package, installed by the plugin test."""
