#ifndef CAUTHBROKERSYSTEM_H
#define CAUTHBROKERSYSTEM_H
#include <stdint.h>
#include <sys/types.h>

/// Layout-identical mirror of Linux's `struct ucred`, which glibc hides behind _GNU_SOURCE.
typedef struct {
    int32_t pid;
    uint32_t uid;
    uint32_t gid;
} cab_ucred;

/// `SOL_SOCKET` and `SO_PEERCRED`, for `getsockopt` through NIO's SocketOptionProvider.
int cab_sol_socket(void);
int cab_so_peercred(void);

/// The credentials of the process at the other end of a connected Unix socket (SO_PEERCRED).
/// Returns 0 on success, or an errno value.
int cab_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/// Makes this process non-dumpable and sets RLIMIT_CORE to 0, because its memory holds
/// keys and passwords. Returns 0 on success, or an errno value.
int cab_disable_core_dumps(void);

/// Sets RLIMIT_CORE to 0 (hard and soft): no core file of a process whose memory holds
/// passwords (systemd-coredump still logs the crash, without the core). It stays dumpable, so the daemon can still read who it
/// is (/proc/PID/exe). Returns 0 on success, or an errno value.
int cab_disable_core_files(void);

/// Sends `state` (e.g. "READY=1") to the service manager over `$NOTIFY_SOCKET`, as
/// sd_notify(3) does, without linking libsystemd. Returns 0 when sent, 1 when no
/// NOTIFY_SOCKET is set (not run by systemd), or an errno value.
int cab_sd_notify(const char *state);

/// 1 if `path` names a Unix socket that accepts connections (a live daemon), 0 if it
/// refuses them or does not exist (stale or absent), or -errno for other failures.
int cab_unix_socket_is_live(const char *path);

/// The owner and mode of `path` (lstat when `follow` is 0), without exposing `struct stat` to
/// Swift (whose members several overlays claim). Returns 0, or an errno value.
int cab_file_owner_mode(const char *path, int follow, uid_t *uid, uint32_t *mode);

/// The owner of one end of a TCP connection, asked of the kernel by an exact
/// NETLINK_SOCK_DIAG (inet_diag) lookup of the socket whose local address is `src` and whose
/// peer is `dst` (`family`: AF_INET with 4-byte, AF_INET6 with 16-byte addresses in network
/// order; ports in host order). Returns 0 and fills `uid` and `inode`, ENOENT when no such
/// socket exists, or another errno value.
int cab_tcp_socket_owner(int family, const uint8_t *src, uint16_t src_port, const uint8_t *dst,
                         uint16_t dst_port, uint32_t *uid, uint64_t *inode);

/// The process holding the socket with `inode` (its `/proc/PID/fd` entry reads
/// `socket:[inode]`), looking only at processes of `uid`, and first at `hint` when it is above
/// 0. Returns 0 and fills `pid`, or ENOENT.
int cab_socket_inode_pid(uint64_t inode, uint32_t uid, int32_t hint, int32_t *pid);

/// glibc's malloc_trim(0): returns free heap pages to the kernel (1 if any were). 0 elsewhere.
int cab_malloc_trim(void);

/// Turns echo off on the terminal `fd` until `cab_tty_echo_restore`. A SIGINT, SIGTERM, SIGHUP
/// or SIGQUIT meanwhile (Ctrl-C at a password prompt) first restores the terminal's settings,
/// then ends the process as that signal would have: the user's shell never keeps echo off.
/// SIGTSTP, SIGTTIN and SIGTTOU (Ctrl-Z) restore them, stop, and turn echo off again when the
/// process goes on. Ignored signals stay ignored. One prompt at a time (EBUSY otherwise).
/// Returns 0, or an errno value (nothing changed).
int cab_tty_echo_off(int fd);

/// Restores the settings `cab_tty_echo_off` saved, and the signals' previous actions.
void cab_tty_echo_restore(void);

#endif
