/* The C side of csrc/native.h (the cffi cdef, which is not included here: its
 * `#define X ...` lines would clash with these headers, which give them their values).
 * glibc >= 2.36's <sys/mount.h> includes <linux/mount.h> itself; an older one does
 * not, and <linux/mount.h> after it only redefines MS_* to the same values. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#ifndef MOUNT_ATTR_RDONLY
#include <linux/mount.h>
#endif
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/bpf.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>

#define RET(expr) do { long _r = (expr); return _r < 0 ? -errno : (int)_r; } while (0)

int nv_mount(const char *source, const char *target, const char *fstype,
             unsigned long flags, const char *data)
{ RET(mount(source, target, fstype, flags, data)); }

int nv_umount2(const char *target, int flags) { RET(umount2(target, flags)); }
int nv_setns(int fd, int nstype) { RET(setns(fd, nstype)); }
int nv_unshare(int flags) { RET(unshare(flags)); }
int nv_pivot_root(const char *new_root, const char *put_old)
{ RET(syscall(__NR_pivot_root, new_root, put_old)); }

int nv_openat2(int dirfd, const char *path, unsigned long long flags,
               unsigned long long mode, unsigned long long resolve)
{
    struct open_how how = { .flags = flags, .mode = mode, .resolve = resolve };
    RET(syscall(__NR_openat2, dirfd, path, &how, sizeof how));
}

int nv_open_tree(int dirfd, const char *path, unsigned int flags)
{ RET(syscall(__NR_open_tree, dirfd, path, flags)); }

int nv_move_mount(int from_dirfd, const char *from_path, int to_dirfd,
                  const char *to_path, unsigned int flags)
{ RET(syscall(__NR_move_mount, from_dirfd, from_path, to_dirfd, to_path, flags)); }

int nv_open_trees(const char *paths, int n, const unsigned char *recursive, int *fds)
{
    struct open_how how = { .flags = O_PATH | O_NOFOLLOW | O_CLOEXEC,
                            .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
    struct stat st;
    int i;
    for (i = 0; i < n; i++, paths += strlen(paths) + 1) {
        int err = 0, tree = -1;
        int pfd = (int)syscall(__NR_openat2, AT_FDCWD, paths, &how, sizeof how);
        if (pfd < 0) {
            err = errno;
        } else {
            if (fstat(pfd, &st) < 0)
                err = errno;
            else if (S_ISLNK(st.st_mode))
                err = ELOOP;
            else {
                tree = (int)syscall(__NR_open_tree, pfd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC
                                    | AT_EMPTY_PATH | (recursive[i] ? AT_RECURSIVE : 0));
                if (tree < 0)
                    err = errno;
            }
            close(pfd);
        }
        if (err) {
            fds[i] = -err;
            return i;
        }
        fds[i] = tree;
    }
    return n;
}

int nv_mount_setattr(int dirfd, const char *path, unsigned int flags,
                     unsigned long long attr_set, unsigned long long attr_clr,
                     unsigned long long propagation)
{
    struct mount_attr a = { .attr_set = attr_set, .attr_clr = attr_clr,
                            .propagation = propagation };
    RET(syscall(__NR_mount_setattr, dirfd, path, flags, &a, sizeof a));
}

static long sys_bpf(int cmd, union bpf_attr *attr)
{ return syscall(__NR_bpf, cmd, attr, sizeof *attr); }

int nv_bpf_prog_load(unsigned int prog_type, const void *insns, unsigned int insn_cnt,
                     const char *license, char *log_buf, unsigned int log_size)
{
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = prog_type;
    a.insns = (uintptr_t)insns;
    a.insn_cnt = insn_cnt;
    a.license = (uintptr_t)license;
    if (log_buf && log_size) {
        a.log_buf = (uintptr_t)log_buf;
        a.log_size = log_size;
        a.log_level = 1;
    }
    RET(sys_bpf(BPF_PROG_LOAD, &a));
}

int nv_bpf_prog_attach(int target_fd, int prog_fd, unsigned int attach_type,
                       unsigned int flags, int replace_fd)
{
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.target_fd = target_fd;
    a.attach_bpf_fd = prog_fd;
    a.attach_type = attach_type;
    a.attach_flags = flags;
    a.replace_bpf_fd = replace_fd;
    RET(sys_bpf(BPF_PROG_ATTACH, &a));
}

int nv_bpf_prog_detach(int target_fd, int prog_fd, unsigned int attach_type)
{
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.target_fd = target_fd;
    a.attach_bpf_fd = prog_fd;
    a.attach_type = attach_type;
    RET(sys_bpf(BPF_PROG_DETACH, &a));
}

int nv_bpf_prog_query(int target_fd, unsigned int attach_type, unsigned int *prog_ids,
                      unsigned int *prog_cnt, unsigned int *attach_flags)
{
    union bpf_attr a;
    long r;
    memset(&a, 0, sizeof a);
    a.query.target_fd = target_fd;
    a.query.attach_type = attach_type;
    a.query.prog_ids = (uintptr_t)prog_ids;
    a.query.prog_cnt = *prog_cnt;
    r = sys_bpf(BPF_PROG_QUERY, &a);
    if (r < 0)
        return -errno;
    *prog_cnt = a.query.prog_cnt;
    if (attach_flags)
        *attach_flags = a.query.attach_flags;
    return 0;
}

int nv_bpf_prog_get_fd_by_id(unsigned int id)
{
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_id = id;
    RET(sys_bpf(BPF_PROG_GET_FD_BY_ID, &a));
}

int nv_bpf_prog_get_insns(int prog_fd, void *insns, unsigned int capacity)
{
    struct bpf_prog_info info;
    union bpf_attr a;
    memset(&info, 0, sizeof info);
    info.xlated_prog_len = capacity;
    info.xlated_prog_insns = (uintptr_t)insns;
    memset(&a, 0, sizeof a);
    a.info.bpf_fd = prog_fd;
    a.info.info_len = sizeof info;
    a.info.info = (uintptr_t)&info;
    if (sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &a) < 0)
        return -errno;
    return (int)info.xlated_prog_len;
}

int nv_fsopen(const char *fsname, unsigned int flags)
{ RET(syscall(__NR_fsopen, fsname, flags)); }

int nv_fsconfig(int fd, unsigned int cmd, const char *key, const char *value, int aux)
{ RET(syscall(__NR_fsconfig, fd, cmd, key, value, aux)); }

int nv_fsmount(int fd, unsigned int flags, unsigned int attr_flags)
{ RET(syscall(__NR_fsmount, fd, flags, attr_flags)); }

long nv_fstatfs_type(int fd)
{
    struct statfs s;
    if (fstatfs(fd, &s) < 0)
        return -errno;
    return (long)s.f_type;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
int nv_populate_write(unsigned long addr, unsigned long len)
{ RET(madvise((void *)addr, len, MADV_POPULATE_WRITE)); }

long long nv_mount_id(int fd)
{
    struct statx stx;
    memset(&stx, 0, sizeof stx);
    if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &stx) < 0)
        return -errno;
    /* both since Linux 5.8; an older kernel cannot tell us, so callers fail closed */
    if (!(stx.stx_mask & STATX_MNT_ID) || !(stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT))
        return -ENOSYS;
    if (stx.stx_mnt_id >> 62)       /* no room for it (STATX_MNT_ID ids are small) */
        return -EOVERFLOW;
    return (long long)(stx.stx_mnt_id << 1) | ((stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0);
}

long long nv_birth_time(int fd)
{
    struct statx stx;
    memset(&stx, 0, sizeof stx);
    if (statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_BTIME, &stx) < 0)
        return -errno;
    if (!(stx.stx_mask & STATX_BTIME) || stx.stx_btime.tv_sec < 0)
        return -ENOSYS;
    return (long long)stx.stx_btime.tv_sec * 1000000000LL + stx.stx_btime.tv_nsec;
}

int nv_join_session_keyring(void)
{ RET(syscall(__NR_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL, 0, 0, 0)); }

/* The ldconfig sandbox's seccomp filter: a deny-list (EPERM) of what ldconfig never
 * needs and what widens the kernel surface a hostile image could reach through it
 * (keyrings, new user namespaces, ptrace, bpf, the mount API, modules, kexec, ...).
 * Hand-built classic BPF, so libseccomp is not a dependency. */
#if defined(__x86_64__)
#define NV_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NV_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "the ldconfig seccomp filter knows x86_64 and aarch64 only"
#endif
/* Numbers from 424 up are the same on every architecture. */
#ifndef __NR_open_tree_attr
#define __NR_open_tree_attr 467
#endif
/* The first syscall number after those of Linux 6.1, which this list was written
 * against: anything newer gets ENOSYS (libc falls back), never silently allowed. */
#define NV_NR_FIRST_UNKNOWN 451
#define NV_CLONE_NS_FLAGS (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET \
                           | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)

static const unsigned int nv_ldconfig_denied[] = {
    __NR_keyctl, __NR_add_key, __NR_request_key,
    __NR_unshare, __NR_setns, __NR_ptrace, __NR_bpf, __NR_perf_event_open,
    __NR_userfaultfd, __NR_io_uring_setup, __NR_io_uring_enter, __NR_io_uring_register,
    __NR_mount, __NR_umount2, __NR_pivot_root, __NR_chroot, __NR_move_mount,
    __NR_open_tree, __NR_open_tree_attr, __NR_fsopen, __NR_fsmount, __NR_fsconfig,
    __NR_fspick, __NR_mount_setattr,
    __NR_kexec_load, __NR_kexec_file_load, __NR_init_module, __NR_finit_module,
    __NR_delete_module, __NR_reboot, __NR_swapon, __NR_swapoff, __NR_acct, __NR_syslog,
    __NR_vhangup, __NR_quotactl, __NR_quotactl_fd,
    __NR_settimeofday, __NR_clock_settime, __NR_clock_adjtime, __NR_adjtimex,
    __NR_sethostname, __NR_setdomainname, __NR_personality,
    __NR_process_vm_readv, __NR_process_vm_writev, __NR_kcmp, __NR_pidfd_getfd,
    __NR_name_to_handle_at, __NR_open_by_handle_at, __NR_fanotify_init,
    __NR_mknodat,
#ifdef __NR_mknod
    __NR_mknod,
#endif
#ifdef __NR_lookup_dcookie
    __NR_lookup_dcookie,
#endif
#ifdef __NR_nfsservctl
    __NR_nfsservctl,
#endif
#ifdef __NR_iopl
    __NR_iopl,
#endif
#ifdef __NR_ioperm
    __NR_ioperm,
#endif
#ifdef __NR_uselib
    __NR_uselib,
#endif
#ifdef __NR__sysctl
    __NR__sysctl,
#endif
#ifdef __NR_create_module
    __NR_create_module,
#endif
#ifdef __NR_get_kernel_syms
    __NR_get_kernel_syms,
#endif
#ifdef __NR_query_module
    __NR_query_module,
#endif
};

#define NV_DENIED (sizeof nv_ldconfig_denied / sizeof nv_ldconfig_denied[0])
#define NV_STMT(code, k) ((struct sock_filter)BPF_STMT((code), (k)))
#define NV_JUMP(code, k, jt, jf) ((struct sock_filter)BPF_JUMP((code), (k), (jt), (jf)))

int nv_seccomp_ldconfig(void)
{
    struct sock_filter f[NV_DENIED + 24];
    struct sock_fprog prog;
    unsigned int n = 0, i, deny;
    const unsigned int arg0 = offsetof(struct seccomp_data, args[0])
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        + 4
#endif
        ;

    /* Another ABI's numbers mean other syscalls: kill (ldconfig is never one). */
    f[n++] = NV_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    f[n++] = NV_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NV_AUDIT_ARCH, 1, 0);
    f[n++] = NV_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    f[n++] = NV_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
#if defined(__x86_64__)
    /* x32 syscalls share AUDIT_ARCH_X86_64, with bit 30 set */
    f[n++] = NV_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000U, 0, 1);
    f[n++] = NV_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
#endif
    /* clone3's flags are behind a pointer BPF cannot read: ENOSYS, libc uses clone */
    f[n++] = NV_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1);
    f[n++] = NV_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
    /* clone: a plain fork is fine, any new namespace (a user namespace first) is not */
    f[n++] = NV_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 0, 4);
    f[n++] = NV_STMT(BPF_LD | BPF_W | BPF_ABS, arg0);
    f[n++] = NV_JUMP(BPF_JMP | BPF_JSET | BPF_K, NV_CLONE_NS_FLAGS, 0, 1);
    f[n++] = NV_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    f[n++] = NV_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    deny = n + NV_DENIED + 3;
    for (i = 0; i < NV_DENIED; i++, n++)
        f[n] = NV_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nv_ldconfig_denied[i], deny - n - 1, 0);
    f[n++] = NV_JUMP(BPF_JMP | BPF_JGE | BPF_K, NV_NR_FIRST_UNKNOWN, 0, 1);
    f[n++] = NV_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
    f[n++] = NV_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[n++] = NV_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);   /* deny */

    prog.len = (unsigned short)n;
    prog.filter = f;
    /* needs no_new_privs (or CAP_SYS_ADMIN); callers set it first */
    RET(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0));
}
