"""Stage 1, the request: what a container asks for (OCI state + spec, CLI flags) as a Request."""
