// muster.v1.Store over gRPC: the Session stream (one client's session, many operations in
// flight, store/store_sessions.h) and the unary Call for one-off requests, served through the
// FrontDoor, so nothing is read before the token is checked.
#pragma once

#include "rendezvous/door/front_door.h"
#include "rendezvous/store/store_sessions.h"

namespace muster::rendezvous {

// Serves /muster.v1.Store/Session and /muster.v1.Store/Call through `door`. `sessions` must
// outlive the door's server.
void serveStore(StoreSessions& sessions, FrontDoor& door);

}  // namespace muster::rendezvous
