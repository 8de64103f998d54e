/* The .note.ABI-tag of the simulated driver libraries, as the driver's own libraries
 * carry it (glibc puts the same note into every executable through crt1.o, but a
 * shared library gets none unless it brings its own). libnvidia-container looks for
 * this section by name in libnvidia-tls.so.* and selects the library only if the note
 * says GNU / NT_GNU_ABI_TAG / Linux SIM_ABI_MAJOR.SIM_ABI_MINOR.SIM_ABI_PATCH (2.3.99).
 * Layout (LSB "ABI note tag"): namesz=4, descsz=16, type=1 (NT_GNU_ABI_TAG), "GNU\0",
 * then four 32-bit words: OS (0 = Linux) and the earliest kernel version. gas makes a
 * section named .note.* SHT_NOTE; "a" = allocated, so the linker also lists it in
 * the PT_NOTE segment. */
	.section ".note.ABI-tag", "a"
	.p2align 2
	.long 1f - 0f           /* namesz */
	.long 3f - 2f           /* descsz */
	.long 1                 /* NT_GNU_ABI_TAG */
0:	.asciz "GNU"
1:	.p2align 2
2:	.long 0                 /* ELF_NOTE_OS_LINUX */
	.long SIM_ABI_MAJOR, SIM_ABI_MINOR, SIM_ABI_PATCH
3:	.p2align 2

	.section .note.GNU-stack, "", %progbits   /* no executable stack */
