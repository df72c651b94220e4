"""The HTTPS admission service: aiohttp application, process, audit log, metrics, tracing,
and the policy store. A thin edge around :mod:`webhook.core`."""
