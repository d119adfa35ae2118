// grpc_echo_bench: gRPC C++ unary echo, the baseline of rpc_bench: latency
// p50/p99 and throughput at 1, 16 and 64 outstanding calls, 32 B and 4 KiB,
// over loopback TCP, server and client in one process, or (--run --connect)
// against a server started apart (--role server), which is how rpc_bench
// places the two sides on different CPUs (--cpus, set before gRPC starts any
// thread, so all of them inherit it). Server: callback API; client: blocking
// stub at 1 outstanding, callback API above. --role server|client runs one
// side alone (callgrind.sh).
#include <grpcpp/grpcpp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpc_echo.grpc.pb.h"

using vrpcbench::Echo;
using vrpcbench::EchoReply;
using vrpcbench::EchoRequest;

namespace
{

bool g_json = false;
unsigned g_duration_ms = 2000;

uint64_t now_ns()
{
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

class EchoService final : public Echo::CallbackService
{
    grpc::ServerUnaryReactor *Echo(grpc::CallbackServerContext *ctx, const EchoRequest *req, EchoReply *rep) override
    {
        rep->set_payload(req->payload());
        rep->set_seq(req->seq());
        served.fetch_add(1, std::memory_order_relaxed);
        auto *r = ctx->DefaultReactor();
        r->Finish(grpc::Status::OK);
        return r;
    }

  public:
    std::atomic<uint64_t> served{0};
};

double pct(std::vector<uint64_t> &v, double p)
{
    if (v.empty())
        return 0;
    std::sort(v.begin(), v.end());
    size_t k = (size_t)(p / 100.0 * (double)v.size() + 0.999999);
    k = k ? k - 1 : 0;
    if (k >= v.size())
        k = v.size() - 1;
    return (double)v[k] / 1000.0;
}

void report(unsigned size, unsigned out, double ops, double p50, double p99)
{
    char name[64];
    snprintf(name, sizeof(name), "baseline:grpc_echo_%u_out%u", size, out);
    if (g_json)
        printf("{\"name\":\"%s\",\"ops_per_s\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f,\"backend\":\"tcp\","
               "\"payload\":%u,\"outstanding\":%u,\"impl\":\"grpc++ %s\"}\n",
               name, ops, p50, p99, size, out, grpc::Version().c_str());
    else
        printf("%-36s %14.0f ops/s  p50 %9.2f us  p99 %9.2f us\n", name, ops, p50, p99);
    fflush(stdout);
}

bool one_call(Echo::Stub *stub, const std::string &payload, uint64_t seq)
{
    EchoRequest req;
    EchoReply rep;
    grpc::ClientContext ctx;
    req.set_payload(payload);
    req.set_seq(seq);
    grpc::Status st = stub->Echo(&ctx, req, &rep);
    if (!st.ok() || rep.seq() != seq || rep.payload().size() != payload.size()) {
        fprintf(stderr, "grpc_echo_bench: call failed: %s\n", st.error_message().c_str());
        return false;
    }
    return true;
}

// Async window: each completion records its latency and starts the next call.
struct Window {
    Echo::Stub *stub;
    std::string payload;
    std::atomic<bool> stop{false};
    std::atomic<unsigned> outstanding{0};
    std::mutex mu;
    std::condition_variable cv;
    std::vector<uint64_t> lat;
    std::mutex lat_mu;
};

struct Slot {
    Window *w;
    uint64_t t0;
    std::unique_ptr<grpc::ClientContext> ctx;
    EchoRequest req;
    EchoReply rep;

    void start()
    {
        ctx = std::make_unique<grpc::ClientContext>();
        req.set_payload(w->payload);
        t0 = now_ns();
        w->stub->async()->Echo(ctx.get(), &req, &rep, [this](grpc::Status st) { done(st); });
    }

    void done(const grpc::Status &st)
    {
        uint64_t t = now_ns();
        if (!st.ok()) {
            fprintf(stderr, "grpc_echo_bench: async call failed: %s\n", st.error_message().c_str());
            exit(1);
        }
        {
            std::lock_guard<std::mutex> g(w->lat_mu);
            w->lat.push_back(t - t0);
        }
        if (!w->stop.load()) {
            start();
        } else if (w->outstanding.fetch_sub(1) == 1) {
            std::lock_guard<std::mutex> g(w->mu);
            w->cv.notify_all();
        }
    }
};

void run_case(Echo::Stub *stub, unsigned size, unsigned out)
{
    std::string payload(size, 'Z');
    uint64_t dur = (uint64_t)g_duration_ms * 1000000, t0, t1;
    for (int i = 0; i < 200; i++)
        if (!one_call(stub, payload, (uint64_t)i))
            exit(1);
    std::vector<uint64_t> lat;
    lat.reserve(1 << 20);
    if (out == 1) {
        uint64_t n = 0;
        t0 = now_ns();
        do {
            uint64_t a = now_ns();
            if (!one_call(stub, payload, n++))
                exit(1);
            t1 = now_ns();
            lat.push_back(t1 - a);
        } while (t1 - t0 < dur);
    } else {
        Window w;
        w.stub = stub;
        w.payload = payload;
        w.outstanding = out;
        w.lat.reserve(1 << 22);
        std::vector<Slot> slots(out);
        t0 = now_ns();
        for (auto &s : slots) {
            s.w = &w;
            s.start();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(g_duration_ms));
        w.stop = true;
        {
            std::unique_lock<std::mutex> g(w.mu);
            w.cv.wait(g, [&] { return w.outstanding.load() == 0; });
        }
        t1 = now_ns();
        lat.swap(w.lat);
    }
    double secs = (double)(t1 - t0) / 1e9;
    double ops = (double)lat.size() / secs;
    double p99 = pct(lat, 99), p50 = pct(lat, 50);
    report(size, out, ops, p50, p99);
}

std::unique_ptr<grpc::Server> start_server(EchoService *svc, const std::string &addr, int *port)
{
    grpc::ServerBuilder b;
    b.AddListeningPort(addr, grpc::InsecureServerCredentials(), port);
    b.RegisterService(svc);
    return b.BuildAndStart();
}

std::unique_ptr<Echo::Stub> stub_for(const std::string &target)
{
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto ch = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return Echo::NewStub(ch);
}

} // namespace

int main(int argc, char **argv)
{
    std::string role, uri, server_ip = "127.0.0.1";
    unsigned long calls = 0, exit_after = 0;
    unsigned size = 32;
    bool run = false;
    const char *cpus = nullptr;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "--json")
            g_json = true;
        else if (a == "--run")
            run = true;
        else if (a == "--quick")
            g_duration_ms = 300;
        else if (a == "--duration-ms" && v)
            g_duration_ms = (unsigned)atoi(argv[++i]);
        else if (a == "--server-ip" && v)
            server_ip = argv[++i];
        else if (a == "--role" && v)
            role = argv[++i];
        else if ((a == "--listen" || a == "--connect") && v)
            uri = argv[++i];
        else if (a == "--calls" && v)
            calls = strtoul(argv[++i], nullptr, 10);
        else if (a == "--exit-after" && v)
            exit_after = strtoul(argv[++i], nullptr, 10);
        else if (a == "--size" && v)
            size = (unsigned)atoi(argv[++i]);
        else if (a == "--cpus" && v)
            cpus = argv[++i];
        else {
            fprintf(a == "--help" ? stdout : stderr,
                    "usage: %s --run [--json] [--quick] [--duration-ms N] [--server-ip IP]\n"
                    "          [--connect HOST:PORT] [--cpus C[,C...]]\n"
                    "       %s --role server --listen HOST:PORT [--exit-after CALLS]\n"
                    "       %s --role client --connect HOST:PORT --calls N [--size BYTES]\n",
                    argv[0], argv[0], argv[0]);
            return a == "--help" ? 0 : 2;
        }
    }
    if (cpus) { // before gRPC starts a thread: every one inherits it
        cpu_set_t set;
        CPU_ZERO(&set);
        for (const char *p = cpus; *p;) {
            char *end;
            long c = strtol(p, &end, 10);
            if (end == p || c < 0 || c >= CPU_SETSIZE) {
                fprintf(stderr, "grpc_echo_bench: bad --cpus '%s'\n", cpus);
                return 2;
            }
            CPU_SET((int)c, &set);
            p = *end == ',' ? end + 1 : end;
        }
        if (sched_setaffinity(0, sizeof(set), &set) != 0) {
            perror("grpc_echo_bench: sched_setaffinity");
            return 1;
        }
    }
    if (role == "server") {
        EchoService svc;
        int port = 0;
        auto srv = start_server(&svc, uri, &port);
        if (!srv)
            return 1;
        printf("127.0.0.1:%d\n", port);
        fflush(stdout);
        while (!exit_after || svc.served.load() < exit_after)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        srv->Shutdown();
        return 0;
    }
    if (role == "client") {
        auto stub = stub_for(uri);
        std::string payload(size, 'Z');
        for (unsigned long i = 0; i < calls; i++)
            if (!one_call(stub.get(), payload, i))
                return 1;
        return 0;
    }
    if (!run) {
        // scripts/bench.sh runs every program; the cases belong in rpc_bench's run
        if (!g_json)
            printf("grpc_echo_bench: the gRPC baseline runs inside rpc_bench (or pass --run)\n");
        return 0;
    }
    EchoService svc;
    std::unique_ptr<grpc::Server> srv;
    if (uri.empty()) { // our own server, in this process
        int port = 0;
        srv = start_server(&svc, server_ip + ":0", &port);
        if (!srv || !port) {
            fprintf(stderr, "grpc_echo_bench: cannot start the server\n");
            return 1;
        }
        uri = server_ip + ":" + std::to_string(port);
    }
    auto stub = stub_for(uri);
    for (unsigned s : {32u, 4096u})
        for (unsigned o : {1u, 16u, 64u})
            run_case(stub.get(), s, o);
    if (srv)
        srv->Shutdown();
    return 0;
}
