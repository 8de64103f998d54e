"""The thin OS layer: native syscalls and kernel constants (cffi), bounded reads, the host's
/proc, mountinfo, privileges, children with deadlines, atomic writes."""
