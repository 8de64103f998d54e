"""How runtimes reach the pipeline: the OCI hook, the warm hook service, the runtime shim, hooks.d."""
