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

/// glibc's malloc_trim(0): returns free heap pages to the kernel (1 if any were). 0 elsewhere.
int cab_malloc_trim(void);

#endif
