/* Syscalls Python 3.11 cannot make. Every function returns the syscall's
 * result, or -errno on failure, so callers never race on errno.
 * This header doubles as the cffi cdef: keep it to plain prototypes. */

int nv_mount(const char *source, const char *target, const char *fstype,
             unsigned long flags, const char *data);
int nv_umount2(const char *target, int flags);
int nv_setns(int fd, int nstype);
int nv_unshare(int flags);
int nv_pivot_root(const char *new_root, const char *put_old);
int nv_openat2(int dirfd, const char *path, unsigned long long flags,
               unsigned long long mode, unsigned long long resolve);
int nv_open_tree(int dirfd, const char *path, unsigned int flags);
int nv_move_mount(int from_dirfd, const char *from_path, int to_dirfd,
                  const char *to_path, unsigned int flags);
int nv_mount_setattr(int dirfd, const char *path, unsigned int flags,
                     unsigned long long attr_set, unsigned long long attr_clr,
                     unsigned long long propagation);

/* bpf(2): one wrapper per command we use, since bpf_attr is a union. */
int nv_bpf_prog_load(unsigned int prog_type, const void *insns, unsigned int insn_cnt,
                     const char *license, char *log_buf, unsigned int log_size);
int nv_bpf_prog_attach(int target_fd, int prog_fd, unsigned int attach_type,
                       unsigned int flags, int replace_fd);
int nv_bpf_prog_detach(int target_fd, int prog_fd, unsigned int attach_type);
int nv_bpf_prog_query(int target_fd, unsigned int attach_type, unsigned int *prog_ids,
                      unsigned int *prog_cnt, unsigned int *attach_flags);
int nv_bpf_prog_get_fd_by_id(unsigned int id);
/* Copies the program's translated instructions into insns (capacity bytes);
 * returns the byte length the kernel reported. */
int nv_bpf_prog_get_insns(int prog_fd, void *insns, unsigned int capacity);

/* New mount API for the procfs tmpfs (built detached, filled, made read-only, then
 * attached) and the filesystem type of an fd (refuse mount targets on proc/sysfs). */
int nv_fsopen(const char *fsname, unsigned int flags);
int nv_fsconfig(int fd, unsigned int cmd, const char *key, const char *value, int aux);
int nv_fsmount(int fd, unsigned int flags, unsigned int attr_flags);
long nv_fstatfs_type(int fd);
