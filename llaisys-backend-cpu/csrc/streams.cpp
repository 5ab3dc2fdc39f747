// Streams and graphs of the host "device". Work on a CPU stream has finished when its call returns, so a
// stream only matters while it is being captured: between graph_begin_capture and graph_end_capture it
// records the ops queued on it (launch() in common/api.h) into a Graph, and graph_launch replays them in
// order. The capture rules are CUDA's (backend.h): while a thread captures, it may not allocate, free,
// synchronize or copy synchronously, so code that works captured here also works captured on a GPU.
#include <cstring>
#include <string>
#include <vector>

#include "common/api.h"

namespace llaisys {

struct Graph {
    struct Call {
        const char* where;
        std::function<void()> body;
    };
    std::vector<Call> calls;
};

namespace {

struct Stream {
    Graph* capture = nullptr;  // set between begin and end capture
};

thread_local int t_open_captures = 0;  // captures this thread has begun and not ended

void check_device(int device) {
    if (device != 0) throw InvalidArgument("cpu has one device (index 0), got " + std::to_string(device));
}

Stream* as_stream(void* stream) {
    if (!stream)
        throw InvalidArgument("the default stream (0) cannot be captured: capture on a stream from stream_create");
    return static_cast<Stream*>(stream);
}

}  // namespace

Graph* capturing_graph(void* stream) { return stream ? static_cast<Stream*>(stream)->capture : nullptr; }

void record_call(Graph* graph, const char* where, std::function<void()> body) {
    graph->calls.push_back(Graph::Call{where, std::move(body)});
}

void refuse_while_capturing(const char* what) {
    if (t_open_captures)
        throw InvalidArgument(std::string(what) + " while this thread captures a graph: nothing may allocate, free, "
                              "synchronize or copy synchronously during a capture");
}

}  // namespace llaisys

using namespace llaisys;

int LLAISYS_FN(stream_create)(int device, void** stream) {
    return guard("stream_create", [&] { check_device(device); *stream = new Stream(); });
}

int LLAISYS_FN(stream_destroy)(int device, void* stream) {
    return guard("stream_destroy", [&] {
        check_device(device);
        Stream* s = as_stream(stream);
        if (s->capture) throw InvalidArgument("the stream is being captured: end the capture first");
        delete s;
    });
}

int LLAISYS_FN(stream_synchronize)(int device, void* stream) {
    return guard("stream_synchronize", [&] {
        check_device(device);
        if (capturing_graph(stream)) throw InvalidArgument("the stream is being captured; it cannot be synchronized");
        refuse_while_capturing("stream_synchronize");
    });
}

int LLAISYS_FN(memset)(int device, void* ptr, int value, size_t nbytes, void* stream) {
    return launch("memset", stream, [=] { check_device(device); std::memset(ptr, value, nbytes); });
}

int LLAISYS_FN(memcpy_async)(int device, void* dst, const void* src, size_t nbytes, int kind, void* stream) {
    return launch("memcpy_async", stream, [=] {
        check_device(device);
        if (kind < LLAISYS_MEMCPY_H2H || kind > LLAISYS_MEMCPY_D2D)
            throw InvalidArgument("unknown memcpy kind " + std::to_string(kind));
        std::memmove(dst, src, nbytes);
    });
}

int LLAISYS_FN(graph_begin_capture)(int device, void* stream) {
    return guard("graph_begin_capture", [&] {
        check_device(device);
        Stream* s = as_stream(stream);
        if (s->capture) throw InvalidArgument("the stream is already being captured");
        s->capture = new Graph();
        ++t_open_captures;
    });
}

int LLAISYS_FN(graph_end_capture)(int device, void* stream, void** graph) {
    return guard("graph_end_capture", [&] {
        check_device(device);
        Stream* s = as_stream(stream);
        if (!s->capture) throw InvalidArgument("the stream is not being captured");
        *graph = s->capture;
        s->capture = nullptr;
        if (t_open_captures) --t_open_captures;  // 0 when another thread began it
    });
}

int LLAISYS_FN(graph_launch)(int device, void* graph, void* stream) {
    std::string failed_call;
    const int status = guard("graph_launch", [&] {
        check_device(device);
        if (!graph) throw InvalidArgument("graph is null");
        if (capturing_graph(stream)) throw NotSupported("launching a graph into a stream being captured");
        for (const Graph::Call& call : static_cast<Graph*>(graph)->calls) {
            failed_call = call.where;
            call.body();
        }
    });
    if (status != kOk && !failed_call.empty())
        set_last_error("graph_launch: recorded " + failed_call + " failed: " + last_error());
    return status;
}

int LLAISYS_FN(graph_destroy)(int device, void* graph) {
    return guard("graph_destroy", [&] { check_device(device); delete static_cast<Graph*>(graph); });
}
