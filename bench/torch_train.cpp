// torch_train: the libtorch peer for bench/train_throughput. Trains the same Fashion-MNIST
// models as `rk train` (mlp, cnn, cnn-small) with the same optimiser and batch, on real
// shuffled mini-batches, and prints one JSON line with the training samples/s.
// Relies on libtorch (PyTorch C++ API, Debian libtorch-dev 1.13) and zlib.
//
// Usage: torch_train --model mlp|cnn|cnn-small [--batch 64] [--threads 2] [--steps N]
//                    [--warmup W] [--data DIR] [--optimizer sgd|adamw] [--seed S]
//                    [--channels-last|--no-channels-last] [--mkldnn|--no-mkldnn]
//                    [--blas-threads T] [--log-every K]
//
// The timed region is what a real training loop does per step: gather the next mini-batch
// from the shuffled permutation, forward, loss, backward, optimiser step. Loading and
// normalising the data set, building the model and the W warm-up steps are not timed.
//
// Peer at its best setting: torch::set_num_threads(threads) (the thread count is the bench's
// choice: bench/train_throughput runs 1 and 2 and keeps the faster), one inter-op thread, and
// the defaults below, chosen by measurement on the bench machine (2 vCPU AMD EPYC, AVX2, no
// AVX-512; Debian libtorch 1.13.1 on oneDNN 2.6.3 and OpenBLAS 0.3.21 pthread; --threads 2,
// batch 64, SGD nesterov; samples/s, median of 3 interleaved runs, range in brackets; the
// machine is shared, so expect +-15%):
//
//   model (steps)     option                          samples/s
//   mlp (2000)        default (--blas-threads 1)      27807  [22867..31569]
//                     --blas-threads 2                10304  [ 9672..12038]
//                     --blas-threads 0 (OpenBLAS's own default, 2 threads)
//                                                      8122  [ 7333..11449]
//   cnn (150)         default (NCHW, mkldnn on)         674  [  669..  713]
//                     --channels-last                   684  [  613..  700]
//                     --no-mkldnn                       395  [  376..  401]
//                     --channels-last --no-mkldnn       390  [  387..  392]
//                     --blas-threads 2                  486  [  483..  487]
//   cnn-small (300)   default (NCHW, mkldnn on)        1592  [ 1428.. 1734]
//                     --channels-last                  1393  [ 1372.. 1476]
//                     --no-mkldnn                      1344  [ 1006.. 1422]
//                     --channels-last --no-mkldnn      1252  [ 1195.. 1308]
//                     --blas-threads 2                 1081  [ 1005.. 1243]
//
// So: mkldnn (oneDNN) convolutions stay on; NCHW stays the default (channels_last ties on
// cnn, within noise, and loses on cnn-small); and OpenBLAS is held to one thread. The last
// matters most: libtorch runs Linear through OpenBLAS (pthread build), whose own thread pool
// fights libtorch's spinning OpenMP workers for the two cores; one BLAS thread is 2.7x faster
// on mlp. (OMP_WAIT_POLICY=passive with two BLAS threads recovers part of it, not all.)
// The step time median is printed too (median_step_samples_per_s): with two BLAS threads it
// stays high while the whole-loop number falls, i.e. the loss is in long stalls.

#include <dlfcn.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace
{

struct Options {
    std::string model = "cnn-small";
    int64_t batch = 64;
    int threads = 2;
    int64_t steps = 500;
    int64_t warmup = 20;
    std::string data = "/usr/share/datasets/fashion-mnist";
    std::string optimizer = "sgd";
    uint64_t seed = 1;
    bool channels_last = false; // default chosen by measurement, see the header comment
    bool mkldnn = true;         // default chosen by measurement, see the header comment
    int blas_threads = 1;       // default chosen by measurement, see the header comment
    int64_t log_every = 0;
};

[[noreturn]] void usage_error(const std::string &msg)
{
    std::fprintf(stderr, "torch_train: %s\n", msg.c_str());
    std::fprintf(stderr, "usage: torch_train --model mlp|cnn|cnn-small [--batch 64] [--threads 2] "
                         "[--steps N] [--warmup W] [--data DIR] [--optimizer sgd|adamw] [--seed S] "
                         "[--channels-last|--no-channels-last] [--mkldnn|--no-mkldnn] "
                         "[--blas-threads T (0: leave OpenBLAS as it is)] [--log-every K]\n");
    std::exit(2);
}

int64_t parse_int(const char *flag, const char *s, int64_t min)
{
    char *end = nullptr;
    errno = 0;
    long long v = std::strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min)
        usage_error(std::string(flag) + ": expected an integer >= " + std::to_string(min) +
                    ", got '" + s + "'");
    return v;
}

Options parse_args(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> const char * {
            if (i + 1 >= argc)
                usage_error(a + ": missing value");
            return argv[++i];
        };
        if (a == "--model") {
            o.model = value();
        } else if (a == "--batch") {
            o.batch = parse_int("--batch", value(), 1);
        } else if (a == "--threads") {
            o.threads = static_cast<int>(parse_int("--threads", value(), 1));
        } else if (a == "--steps") {
            o.steps = parse_int("--steps", value(), 1);
        } else if (a == "--warmup") {
            o.warmup = parse_int("--warmup", value(), 0);
        } else if (a == "--data") {
            o.data = value();
        } else if (a == "--optimizer") {
            o.optimizer = value();
        } else if (a == "--seed") {
            o.seed = static_cast<uint64_t>(parse_int("--seed", value(), 0));
        } else if (a == "--channels-last") {
            o.channels_last = true;
        } else if (a == "--no-channels-last") {
            o.channels_last = false;
        } else if (a == "--mkldnn") {
            o.mkldnn = true;
        } else if (a == "--no-mkldnn") {
            o.mkldnn = false;
        } else if (a == "--blas-threads") {
            o.blas_threads = static_cast<int>(parse_int("--blas-threads", value(), 0));
        } else if (a == "--log-every") {
            o.log_every = parse_int("--log-every", value(), 0);
        } else if (a == "-h" || a == "--help") {
            usage_error("help");
        } else {
            usage_error("unknown argument '" + a + "'");
        }
    }
    if (o.model != "mlp" && o.model != "cnn" && o.model != "cnn-small")
        usage_error("--model: expected mlp, cnn or cnn-small, got '" + o.model + "'");
    if (o.optimizer != "sgd" && o.optimizer != "adamw")
        usage_error("--optimizer: expected sgd or adamw, got '" + o.optimizer + "'");
    return o;
}

// ---- Data: gzip'd IDX files read with zlib ----------------------------------------------

[[noreturn]] void data_error(const std::string &path, const std::string &msg)
{
    std::fprintf(stderr, "torch_train: %s: %s\n", path.c_str(), msg.c_str());
    std::exit(2);
}

std::vector<uint8_t> gunzip_file(const std::string &path)
{
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f)
        data_error(path, std::string("cannot open: ") + std::strerror(errno));
    std::vector<uint8_t> out;
    std::vector<uint8_t> buf(1 << 20);
    for (;;) {
        int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
        if (n < 0) {
            int err = 0;
            std::string msg = gzerror(f, &err);
            gzclose(f);
            data_error(path, "gzip read failed: " + msg);
        }
        if (n == 0)
            break;
        out.insert(out.end(), buf.begin(), buf.begin() + n);
    }
    gzclose(f);
    return out;
}

uint32_t be32(const uint8_t *p)
{
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// Images as a float tensor [n,1,28,28], normalised (x/255 - mean)/std.
torch::Tensor load_images(const std::string &path)
{
    std::vector<uint8_t> b = gunzip_file(path);
    if (b.size() < 16)
        data_error(path, "IDX header: file shorter than 16 bytes");
    if (be32(b.data()) != 0x00000803)
        data_error(path, "IDX header: magic is not 0x00000803");
    uint32_t n = be32(b.data() + 4), rows = be32(b.data() + 8), cols = be32(b.data() + 12);
    if (rows != 28 || cols != 28)
        data_error(path, "IDX header: images are not 28x28");
    if (b.size() != 16 + uint64_t(n) * rows * cols)
        data_error(path, "IDX body: size does not match the header's count");
    const float mean = 0.2860f, stdev = 0.3530f;
    torch::Tensor x = torch::empty({int64_t(n), 1, 28, 28}, torch::kFloat32);
    float *px = x.data_ptr<float>();
    const uint8_t *src = b.data() + 16;
    for (size_t i = 0; i < size_t(n) * 784; i++)
        px[i] = (float(src[i]) / 255.0f - mean) / stdev;
    return x;
}

torch::Tensor load_labels(const std::string &path)
{
    std::vector<uint8_t> b = gunzip_file(path);
    if (b.size() < 8)
        data_error(path, "IDX header: file shorter than 8 bytes");
    if (be32(b.data()) != 0x00000801)
        data_error(path, "IDX header: magic is not 0x00000801");
    uint32_t n = be32(b.data() + 4);
    if (b.size() != 8 + uint64_t(n))
        data_error(path, "IDX body: size does not match the header");
    torch::Tensor y = torch::empty({int64_t(n)}, torch::kInt64);
    int64_t *py = y.data_ptr<int64_t>();
    for (uint32_t i = 0; i < n; i++) {
        if (b[8 + i] > 9)
            data_error(path, "label " + std::to_string(i) + " is not in 0..9");
        py[i] = b[8 + i];
    }
    return y;
}

// ---- Models --------------------------------------------------------------------------

torch::nn::Sequential make_model(const std::string &name)
{
    namespace nn = torch::nn;
    if (name == "mlp")
        return nn::Sequential(nn::Flatten(), nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 128),
                              nn::ReLU(), nn::Linear(128, 10));
    if (name == "cnn") // the TensorFlow tutorial net
        return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 5).padding(2)), nn::ReLU(),
                              nn::MaxPool2d(2), nn::Conv2d(nn::Conv2dOptions(32, 64, 5).padding(2)),
                              nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(), nn::Linear(3136, 1024),
                              nn::ReLU(), nn::Dropout(0.4), nn::Linear(1024, 10));
    // cnn-small
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), nn::ReLU(),
                          nn::MaxPool2d(2), nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)),
                          nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(), nn::Linear(3136, 128),
                          nn::ReLU(), nn::Linear(128, 10));
}

// Sets OpenBLAS's own thread pool size, when libtorch's BLAS is OpenBLAS (Debian's is).
// Looked up at run time so the peer still builds and runs against another BLAS. Returns the
// resulting thread count, or -1 when this process has no OpenBLAS.
int set_blas_threads(int n)
{
    using set_fn = void (*)(int);
    using get_fn = int (*)();
    auto set = reinterpret_cast<set_fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    auto get = reinterpret_cast<get_fn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    if (!set || !get)
        return -1;
    if (n > 0)
        set(n);
    return get();
}

// Seeded Fisher-Yates permutation of 0..n-1 (mt19937_64, so the same seed gives the same order).
std::vector<int64_t> permutation(int64_t n, std::mt19937_64 &rng)
{
    std::vector<int64_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), int64_t(0));
    for (int64_t i = n - 1; i > 0; i--) {
        std::uniform_int_distribution<int64_t> d(0, i);
        std::swap(p[size_t(i)], p[size_t(d(rng))]);
    }
    return p;
}

// Walks the data set in shuffled order, one mini-batch at a time, reshuffling at each epoch
// end (a short tail is dropped, as DataLoader(drop_last=True) does).
class Batches
{
  public:
    Batches(torch::Tensor x, torch::Tensor y, int64_t batch, uint64_t seed, bool channels_last)
        : x_(std::move(x)), y_(std::move(y)), batch_(batch), rng_(seed),
          channels_last_(channels_last)
    {
        if (x_.size(0) < batch_) {
            std::fprintf(stderr,
                         "torch_train: data set has %" PRId64 " samples, fewer than a batch\n",
                         x_.size(0));
            std::exit(2);
        }
        reshuffle();
    }

    void next(torch::Tensor &xb, torch::Tensor &yb)
    {
        if (pos_ + batch_ > x_.size(0))
            reshuffle();
        torch::NoGradGuard no_grad; // gathering data is not part of the graph
        torch::Tensor idx = perm_.narrow(0, pos_, batch_);
        xb = x_.index_select(0, idx);
        if (channels_last_)
            xb = xb.contiguous(torch::MemoryFormat::ChannelsLast);
        yb = y_.index_select(0, idx);
        pos_ += batch_;
    }

  private:
    void reshuffle()
    {
        std::vector<int64_t> p = permutation(x_.size(0), rng_);
        perm_ = torch::from_blob(p.data(), {int64_t(p.size())}, torch::kInt64).clone();
        pos_ = 0;
    }

    torch::Tensor x_, y_, perm_;
    int64_t batch_;
    int64_t pos_ = 0;
    std::mt19937_64 rng_;
    bool channels_last_;
};

} // namespace

int main(int argc, char **argv)
{
    Options o = parse_args(argc, argv);

    // Threads first: the inter-op pool size must be set before any parallel work starts.
    at::set_num_interop_threads(1);
    torch::set_num_threads(o.threads);
    at::globalContext().setUserEnabledMkldnn(o.mkldnn);
    int blas_threads = set_blas_threads(o.blas_threads);
    torch::manual_seed(o.seed);

    torch::Tensor x = load_images(o.data + "/train-images-idx3-ubyte.gz");
    torch::Tensor y = load_labels(o.data + "/train-labels-idx1-ubyte.gz");
    if (x.size(0) != y.size(0)) {
        std::fprintf(stderr, "torch_train: %s: %" PRId64 " images but %" PRId64 " labels\n",
                     o.data.c_str(), x.size(0), y.size(0));
        return 2;
    }

    bool conv = o.model != "mlp";
    bool channels_last = conv && o.channels_last;
    torch::nn::Sequential model = make_model(o.model);
    if (channels_last) {
        torch::NoGradGuard no_grad;
        for (auto &p : model->parameters())
            if (p.dim() == 4)
                p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
    }
    model->train();

    std::unique_ptr<torch::optim::Optimizer> opt;
    if (o.optimizer == "sgd")
        opt = std::make_unique<torch::optim::SGD>(
            model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).nesterov(true));
    else
        opt = std::make_unique<torch::optim::AdamW>(
            model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));

    Batches batches(x, y, o.batch, o.seed, channels_last);
    torch::Tensor xb, yb, loss;
    auto step = [&](int64_t i, bool timed) {
        batches.next(xb, yb);
        opt->zero_grad();
        torch::Tensor logits = model->forward(xb);
        loss = torch::nn::functional::cross_entropy(logits, yb); // mean over the batch
        loss.backward();
        opt->step();
        if (o.log_every > 0 && (i + 1) % o.log_every == 0)
            std::fprintf(stderr, "%s step %" PRId64 " loss %.4f\n", timed ? "timed" : "warmup",
                         i + 1, loss.item<float>());
    };

    for (int64_t i = 0; i < o.warmup; i++)
        step(i, false);
    // Per-step times too: the median step is a noise-robust second opinion on a shared machine
    // (the headline samples_per_s is the whole timed loop, as rk reports it).
    std::vector<double> step_s(static_cast<size_t>(o.steps));
    auto t0 = std::chrono::steady_clock::now();
    auto prev = t0;
    for (int64_t i = 0; i < o.steps; i++) {
        step(i, true);
        auto now = std::chrono::steady_clock::now();
        step_s[size_t(i)] = std::chrono::duration<double>(now - prev).count();
        prev = now;
    }
    auto t1 = prev;
    std::nth_element(step_s.begin(), step_s.begin() + o.steps / 2, step_s.end());
    double median_step_s = step_s[size_t(o.steps / 2)];
    float final_loss = loss.item<float>();

    double secs = std::chrono::duration<double>(t1 - t0).count();
    double sps = double(o.steps * o.batch) / secs;
    std::printf("{\"peer\":\"libtorch\",\"model\":\"%s\",\"batch\":%" PRId64
                ",\"threads\":%d,\"steps\":%" PRId64 ",\"samples_per_s\":%.1f,"
                "\"median_step_samples_per_s\":%.1f,\"final_loss\":%.6f,\"optimizer\":\"%s\","
                "\"channels_last\":%s,\"mkldnn\":%s,\"blas_threads\":%d,\"seconds\":%.3f,"
                "\"torch_version\":\"%d.%d.%d\"}\n",
                o.model.c_str(), o.batch, o.threads, o.steps, sps, double(o.batch) / median_step_s,
                final_loss, o.optimizer.c_str(), channels_last ? "true" : "false",
                o.mkldnn ? "true" : "false", blas_threads, secs, TORCH_VERSION_MAJOR,
                TORCH_VERSION_MINOR, TORCH_VERSION_PATCH);
    if (!std::isfinite(final_loss)) {
        std::fprintf(stderr, "torch_train: loss is not finite\n");
        return 1;
    }
    return 0;
}
