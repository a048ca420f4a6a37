// The worker library's side of the stack roll-call (common/contract.h): a handler on the
// signal launch names that writes the native stack of every thread of this process, with
// function names, to the file launch names. And progress: heartbeats launch counts against
// --hang_timeout.
#pragma once

namespace muster::worker {

// Installs the handler when launch asked for one (MUSTER_STACKS_FILE, MUSTER_STACKS_SIGNAL)
// and the signal has no handler yet (in a Python process, faulthandler has it). Runs by itself
// when a program linked with the worker library starts, and from WorkerEnv::fromProcess();
// calling it again does nothing. True when this process's handler is installed.
bool installStackDump();

// Tells launch that this rank is making progress (MUSTER_PROGRESS_FIFO; nothing without it).
// Cheap: at most one write a second, never blocking; call it from a training loop as often as
// you like. `worker train` calls it after each gradient all-reduce.
void heartbeat();

}  // namespace muster::worker
