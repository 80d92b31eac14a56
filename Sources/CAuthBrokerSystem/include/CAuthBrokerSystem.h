#ifndef CAUTHBROKERSYSTEM_H
#define CAUTHBROKERSYSTEM_H
#include <sys/types.h>

/// The credentials of the process at the other end of a connected Unix socket (SO_PEERCRED).
/// Returns 0 on success, or an errno value.
int cab_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/// Makes this process non-dumpable and sets RLIMIT_CORE to 0, because its memory holds
/// keys and passwords. Returns 0 on success, or an errno value.
int cab_disable_core_dumps(void);

#endif
