"""Code that runs on a GPU node, inside a pod: checks of what the node actually enforces."""
