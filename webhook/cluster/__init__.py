"""The cluster edge: what the service and the CLI read from the Kubernetes API."""
