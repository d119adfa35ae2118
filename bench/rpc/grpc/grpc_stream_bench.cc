// grpc_stream_bench: gRPC C++ streaming message rates, the baseline of
// rpc_bench_stream (which runs it as a child with --run --json): server
// streaming (the server writes payload-sized messages until the client
// cancels, counted at the client's reader) and bidi echo (a client writer
// thread and reader thread per stream, echoes counted), 32 B and 4 KiB, on
// 1 and 16 streams of one channel, over loopback TCP, server and client in
// one process. Synchronous API on both sides (a thread per stream and
// direction), gRPC's default flow-control windows.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "grpc_stream.grpc.pb.h"

using vrpcbenchstream::EchoReply;
using vrpcbenchstream::EchoRequest;
using vrpcbenchstream::Stream;

namespace
{

bool g_json = false;
unsigned g_duration_ms = 1000;
std::atomic<uint64_t> g_reads{0};

uint64_t now_ns()
{
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

class StreamService final : public Stream::Service
{
    grpc::Status ServerStream(grpc::ServerContext *ctx, const EchoRequest *req,
                              grpc::ServerWriter<EchoReply> *w) override
    {
        EchoReply rep;
        rep.set_payload(req->payload());
        for (uint64_t i = 0; !ctx->IsCancelled(); i++) {
            rep.set_seq(i);
            if (!w->Write(rep))
                break;
        }
        return grpc::Status::OK;
    }

    grpc::Status Bidi(grpc::ServerContext *ctx, grpc::ServerReaderWriter<EchoReply, EchoRequest> *rw) override
    {
        EchoRequest req;
        EchoReply rep;
        while (!ctx->IsCancelled() && rw->Read(&req)) {
            rep.set_payload(req.payload());
            rep.set_seq(req.seq());
            if (!rw->Write(rep))
                break;
        }
        return grpc::Status::OK;
    }
};

void report(const char *shape, unsigned size, unsigned streams, double ops)
{
    char name[96];
    snprintf(name, sizeof(name), "baseline:grpc_stream_%s_%uB_s%u", shape, size, streams);
    if (g_json)
        printf("{\"name\":\"%s\",\"ops_per_s\":%.3f,\"p50_us\":null,\"p99_us\":null,\"backend\":\"tcp\","
               "\"payload\":%u,\"streams\":%u,\"impl\":\"grpc++ %s\"}\n",
               name, ops, size, streams, grpc::Version().c_str());
    else
        printf("%-40s %14.0f msg/s\n", name, ops);
    fflush(stdout);
}

// One stream's client side: readers count, writers (bidi) write until stop.
struct Client {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<EchoReply>> rd;
    std::unique_ptr<grpc::ClientReaderWriter<EchoRequest, EchoReply>> rw;
    std::thread reader, writer;
};

void run_case(Stream::Stub *stub, bool bidi, unsigned size, unsigned streams)
{
    std::string payload(size, 'Z');
    std::atomic<bool> stop{false};
    std::vector<Client> c(streams);
    for (auto &x : c) {
        x.ctx = std::make_unique<grpc::ClientContext>();
        if (bidi) {
            x.rw = stub->Bidi(x.ctx.get());
            auto *rw = x.rw.get();
            x.writer = std::thread([rw, &payload, &stop] {
                EchoRequest req;
                req.set_payload(payload);
                for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); i++) {
                    req.set_seq(i);
                    if (!rw->Write(req))
                        break;
                }
            });
            x.reader = std::thread([rw] {
                EchoReply rep;
                while (rw->Read(&rep))
                    g_reads.fetch_add(1, std::memory_order_relaxed);
            });
        } else {
            EchoRequest req;
            req.set_payload(payload);
            x.rd = stub->ServerStream(x.ctx.get(), req);
            auto *rd = x.rd.get();
            x.reader = std::thread([rd] {
                EchoReply rep;
                while (rd->Read(&rep))
                    g_reads.fetch_add(1, std::memory_order_relaxed);
            });
        }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100)); // warm up
    uint64_t r0 = g_reads.load(), t0 = now_ns();
    std::this_thread::sleep_for(std::chrono::milliseconds(g_duration_ms));
    uint64_t r1 = g_reads.load(), t1 = now_ns();
    stop = true;
    for (auto &x : c)
        x.ctx->TryCancel();
    for (auto &x : c) {
        if (x.writer.joinable())
            x.writer.join();
        x.reader.join();
        if (x.rw)
            x.rw->Finish();
        else
            x.rd->Finish();
    }
    report(bidi ? "bidi" : "server", size, streams, (double)(r1 - r0) * 1e9 / (double)(t1 - t0));
}

} // namespace

int main(int argc, char **argv)
{
    std::string server_ip = "127.0.0.1";
    bool run = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "--json")
            g_json = true;
        else if (a == "--run")
            run = true;
        else if (a == "--quick")
            g_duration_ms = 200;
        else if (a == "--duration-ms" && v)
            g_duration_ms = (unsigned)atoi(argv[++i]);
        else if (a == "--server-ip" && v)
            server_ip = argv[++i];
        else {
            fprintf(a == "--help" ? stdout : stderr,
                    "usage: %s --run [--json] [--quick] [--duration-ms N] [--server-ip IP]\n", argv[0]);
            return a == "--help" ? 0 : 2;
        }
    }
    if (!run) {
        // scripts/bench.sh runs every program; the cases belong in rpc_bench_stream's run
        if (!g_json)
            printf("grpc_stream_bench: the gRPC streaming baseline runs inside rpc_bench_stream (or pass --run)\n");
        return 0;
    }
    StreamService svc;
    int port = 0;
    grpc::ServerBuilder b;
    b.AddListeningPort(server_ip + ":0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&svc);
    auto srv = b.BuildAndStart();
    if (!srv || !port) {
        fprintf(stderr, "grpc_stream_bench: cannot start the server\n");
        return 1;
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto ch =
        grpc::CreateCustomChannel(server_ip + ":" + std::to_string(port), grpc::InsecureChannelCredentials(), args);
    ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stub = Stream::NewStub(ch);
    for (unsigned size : {32u, 4096u})
        for (bool bidi : {false, true})
            for (unsigned n : {1u, 16u})
                run_case(stub.get(), bidi, size, n);
    srv->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return 0;
}
