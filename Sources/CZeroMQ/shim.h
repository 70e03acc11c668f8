#ifndef STATESYNC_CZEROMQ_SHIM_H
#define STATESYNC_CZEROMQ_SHIM_H
#include <zmq.h>
#endif
