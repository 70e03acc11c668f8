#ifndef C_PROCESS_SPAWN_H
#define C_PROCESS_SPAWN_H

#include <spawn.h>

/// glibc's `posix_spawn_file_actions_addchdir_np` (2.29+): the child changes directory
/// before it runs the program.
int cprocessspawn_addchdir(posix_spawn_file_actions_t *actions, const char *path);

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+): the child closes every file
/// descriptor from `lowest` up, so it inherits only what was handed to it.
int cprocessspawn_addclosefrom(posix_spawn_file_actions_t *actions, int lowest);

#endif
