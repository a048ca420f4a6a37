// The way in for every call that sends one request: the store's Call, the rendezvous methods
// and health. gRPC's typed unary and server-streaming methods read the whole request before
// their handler runs, so a caller without the token could make the server hold the largest
// message it accepts (a 1 GB call took rendezvousd from 17 MB to 2.6 GB before it was
// refused). These methods are served through gRPC's generic API instead: the method is looked
// up and the token checked from the call's metadata, and only an admitted call's request is
// read.
//
// It is the async generic API, on several completion queues with a thread each, not the
// callback API: every call waiting for its answer (a join until its round is complete, a get
// until its key is set) keeps one operation outstanding on its queue, and Debian's libgrpc
// (built with its debug checks) searches a queue's outstanding operations linearly on every
// completion. On the callback API's one queue, 65,536 parked joins made that O(N^2): 30% of
// the service's time in rdzv_bench. Here each queue holds 1/K of them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <string_view>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/message_lite.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include "rendezvous/rpc/auth.h"

namespace muster::rendezvous {

// The answer to one admitted call, shared by whatever completes it. Thread-safe; the first
// finish wins and later writes and finishes are ignored.
class Answer {
 public:
  // Queues `message` for the client (a server-streaming method may write several).
  void write(const google::protobuf::MessageLite& message);
  // Ends the call with `status` once what was written has gone. False: it had ended already.
  bool finish(const grpc::Status& status);
  // A unary answer: `message` then OK.
  bool reply(const google::protobuf::MessageLite& message);
  // `hook` runs once, on a gRPC thread with no lock of the caller's held: as soon as the client
  // leaves (or the server cancels the call) with `clientGone` true, else when the call is over
  // after a finish. Registered after either, it runs at once.
  void onEnd(std::function<void(bool clientGone)> hook);
  const std::string& peer() const { return peer_; }

 private:
  friend class FrontDoor;
  friend class StreamReactor;
  class Reactor;
  Answer(Reactor* reactor, std::string peer) : reactor_(reactor), peer_(std::move(peer)) {}
  // Reactor events.
  void written(bool ok);
  void cancelled();
  // One of the call's operations came back: true when it was the last (the call is over; the
  // reactor may go). Under mu_, so that no operation starts on a call that is going.
  bool operationDone();
  void pumpLocked();
  // The client left: end the call; returns the hook to run (outside the lock).
  std::function<void(bool)> clientLeftLocked();

  std::mutex mu_;
  Reactor* reactor_;            // null once the call is over
  std::deque<grpc::ByteBuffer> queue_;
  bool writing_ = false;
  bool ending_ = false;         // finish asked (or the client left)
  bool finished_ = false;       // Finish given to gRPC
  bool clientGone_ = false;
  bool over_ = false;
  grpc::Status status_;
  std::function<void(bool)> hook_;
  std::string peer_;
};

// A bidirectional stream served by the FrontDoor (the store's Session): the shape of gRPC's
// callback reactor over the async API. Operations may be started from any thread, one read
// and one write at a time and Finish once; every stream must Finish, even after OnCancel.
// OnDone comes last, once Finish is back and the call is over; it may delete the reactor.
class StreamReactor {
 public:
  virtual ~StreamReactor() = default;

  // Reads the next message; OnReadDone, then readInto takes it.
  void StartRead();
  // The message last read; false when it does not parse.
  bool readInto(google::protobuf::MessageLite& message);
  // Writes `message` (serialized now); OnWriteDone.
  void StartWrite(const google::protobuf::MessageLite& message);
  void Finish(const grpc::Status& status);

  // The call is admitted: the first operations start here, not in the constructor.
  virtual void OnStart() = 0;
  virtual void OnReadDone(bool ok) = 0;
  virtual void OnWriteDone(bool ok) = 0;
  // The client left (or the call was cancelled); Finish is still due.
  virtual void OnCancel() {}
  virtual void OnDone() = 0;

 private:
  friend class Answer;
  Answer::Reactor* call_ = nullptr;
  grpc::ByteBuffer read_;
  bool writeFailed_ = false;  // the write in flight could not be serialized
};

// Thread-safety: add() and attach() before the server starts, start() after; the rest from
// any thread. Lifetime: stop() (or the destructor) after the grpc::Server has shut down.
class FrontDoor final {
 public:
  using Handler = std::function<void(grpc::ByteBuffer& request, std::shared_ptr<Answer> answer)>;
  // Makes the reactor of an admitted stream (its metadata in `context`).
  using StreamFactory = std::function<StreamReactor*(const grpc::GenericServerContext& context)>;

  // `gate`: the server's token check (shared with the streams it serves itself).
  explicit FrontDoor(TokenGate& gate) : gate_(gate) {}
  ~FrontDoor();

  // Serves `method` ("/package.Service/Method"). `guarded`: only with the token. A method open
  // to all (health: probes carry no secret) reads the request only of a caller with the token;
  // the others' handler gets an empty request (the message's defaults), so that no stranger
  // can make the server hold a large message.
  void add(std::string method, Handler handler, bool guarded = true);
  // The same, with the request parsed; one that does not parse ends INVALID_ARGUMENT.
  template <class Request>
  void add(std::string method, std::function<void(const Request&, std::shared_ptr<Answer>)> handler,
           bool guarded = true) {
    add(std::move(method), [handler = std::move(handler)](grpc::ByteBuffer& bytes, std::shared_ptr<Answer> answer) {
      Request request;
      grpc::Status parsed = bytes.Valid() ? grpc::SerializationTraits<Request>::Deserialize(&bytes, &request)
                                          : grpc::Status::OK;
      if (!parsed.ok()) {
        answer->finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "the request does not parse: " + parsed.error_message()));
        return;
      }
      handler(request, std::move(answer));
    }, guarded);
  }

  // Serves the bidirectional stream `method`, only with the token: nothing is read before the
  // token is checked.
  void addStream(std::string method, StreamFactory factory);

  // Told the peer (gRPC's peer()) of each admitted call that carried the token (every admitted
  // call where the server has none): its connection is a member's. Before start().
  void onMember(std::function<void(std::string_view peer)> hook) { onMember_ = std::move(hook); }

  // Calls that arrive from now on end UNAVAILABLE.
  void close();
  // Admitted one-request calls not yet over (streams are not counted).
  int64_t inFlight() const { return inFlight_.load(); }

  // Registers with `builder`: the generic service and `queues` completion queues (0: one per
  // core, from 8 to 64).
  void attach(grpc::ServerBuilder& builder, int queues = 0);
  // Once the server is built: a thread per queue, each with calls requested.
  void start();
  // Once the server has shut down: drains and closes the queues and joins their threads.
  void stop();

 private:
  friend class Answer::Reactor;
  struct Method {
    Handler handler;       // a one-request method
    StreamFactory stream;  // or a stream
    bool guarded = true;
  };
  // A new call on one of the queues: admitted (reading first if `read`) or refused.
  const Method* admit(grpc::GenericServerContext& context, grpc::Status& refusal, bool& read);
  // Requests the next call, told on `notify`.
  void request(grpc::ServerCompletionQueue* notify);
  static constexpr int kRequestsAhead = 8;
  std::function<void(std::string_view peer)> onMember_;

  TokenGate& gate_;
  std::map<std::string, Method, std::less<>> methods_;
  std::mutex mu_;
  bool closed_ = false;
  std::atomic<int64_t> inFlight_{0};  // the door outlives its calls (stop() waits for them)
  grpc::AsyncGenericService generic_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  std::atomic<size_t> next_{0};
  std::mutex queuesMu_;
  bool queuesOpen_ = false;  // requests may be made (the queues are not shut down)
  bool stopped_ = false;
  std::atomic<int64_t> live_{0};  // Reactors: calls and requests for one
  std::condition_variable liveCv_;
};

}  // namespace muster::rendezvous
