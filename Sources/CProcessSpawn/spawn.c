// The two GNU file actions of posix_spawn that Swift's Glibc module does not import (they are
// declared only under _GNU_SOURCE). Nothing else lives here.
#define _GNU_SOURCE
#include <errno.h>
#include <spawn.h>
#include "CProcessSpawn.h"

int cprocessspawn_addchdir(posix_spawn_file_actions_t *actions, const char *path) {
    return posix_spawn_file_actions_addchdir_np(actions, path);
}

int cprocessspawn_addclosefrom(posix_spawn_file_actions_t *actions, int lowest) {
#if defined(__GLIBC__)
    return posix_spawn_file_actions_addclosefrom_np(actions, lowest);
#else
    (void)actions;
    (void)lowest;
    return ENOSYS;
#endif
}
