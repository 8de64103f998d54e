"""The thin OS layer: native syscalls (cffi), bounded reads, mountinfo, privileges, children with deadlines, atomic writes."""
