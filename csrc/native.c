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
#include <sys/mount.h>
#ifndef MOUNT_ATTR_RDONLY
#include <linux/mount.h>
#endif
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/bpf.h>
#include <linux/magic.h>
#include <linux/openat2.h>

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
