// Where a Fanout sends the CHUNK and END frames meant for children that
// pull them from an object store (PlanNode::pulls_objects) instead of
// reading them from their link (docs/PROTOCOL.md §"Chunks through an
// object store"). The coordinator's ObjectUploader implements it.
//
// Thread safety: Push and QueuedBytes are called on the Fanout owner's
// thread; an implementation may store the frames from threads of its own.
#ifndef DCR_PROTOCOL_OBJECT_SINK_H_
#define DCR_PROTOCOL_OBJECT_SINK_H_

#include <cstddef>

#include "dcr/wire.h"

namespace dcr {

class ObjectSink {
 public:
  virtual ~ObjectSink() = default;
  // Takes `frame` (a whole CHUNK or END frame) as the next object of the
  // refit's sequence; never blocks (QueuedBytes is the backpressure).
  virtual void Push(const FrameBuffer& frame) = 0;
  // Bytes pushed and not yet stored.
  virtual size_t QueuedBytes() const = 0;
};

}  // namespace dcr

#endif  // DCR_PROTOCOL_OBJECT_SINK_H_
