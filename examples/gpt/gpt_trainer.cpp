// gpt_trainer: a small Llama-architecture model (model.hpp: LlamaForCausalLM's names and math)
// trained with libtorch over MPI ranks, tensor-parallel (attention heads and MLP units split over
// --tp ranks), pipeline-parallel (the decoder layers cut into --pp stages, micro-batches passed
// stage to stage) and data-parallel with a distributed optimizer (each data-parallel rank keeps
// AdamW state for a flat slice of every parameter of its stage), with a warmup/cosine learning
// rate schedule as a libtorch LRScheduler, checkpointed through cairn's checkpointer and resumed
// on other tensor, pipeline and data-parallel sizes.
//
// Each phase is one mpirun (examples/gpt/README section of the top-level README):
//   mpirun -np 4 gpt_trainer --phase reference --tp 2   uninterrupted run: loss curve, logits
//   mpirun -np 4 gpt_trainer --phase train --tp 2 --pp 2
//                                                       checkpoints every --save-every steps,
//                                                       "crashes" at --interrupt-at
//   mpirun -np 2 gpt_trainer --phase resume --tp 2      resumes from the latest checkpoint
//   mpirun -np 3 gpt_trainer --phase resume --tp 1      (any tp dividing the heads, pp at most
//                                                       the layers, dp the micro-batches)
//   gpt_trainer --phase compare                         resumes against the reference
//   mpirun -np 2 gpt_trainer --phase import --tp 2 --from HF_DIR --steps 20
//                                                       starts from a model transformers saved
// Flags: --dir DIR --ckpt NAME (checkpoints in DIR/NAME, default ckpt) --pp N --steps N
//        --interrupt-at N --save-every N --layers N --width N --micro-batches N
//        --precision bf16 (mixed precision: a bf16 model, fp32 masters saved with the optimizer)
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cairn/cairn.hpp"
#include "cairn/comm/mpi.hpp"
#include "cairn/libtorch.hpp"
#include "model.hpp"

namespace fs = std::filesystem;

namespace {

struct options {
  fs::path dir = "gpt-ckpt";
  std::string phase;
  std::string ckpt = "ckpt";  ///< the checkpoints' folder under `dir`
  int tp = 1, pp = 1;
  std::int64_t steps = 60, interrupt_at = 37, save_every = 10, micro_batches = 6, micro_batch = 4,
               warmup = 10, seed = 1234;
  double lr = 3e-3;
  /// --precision bf16: mixed precision, the model in bf16 and the distributed optimizer's
  /// slices fp32 masters (saved with the optimizer's state); fp32 (the default): one precision.
  bool bf16 = false;
  gpt::config model;
  fs::path from;  ///< --from: a `transformers` save_pretrained directory (--phase import)
};

/// The checkpointed training state: the model (this stage's tensor-parallel pieces), the
/// distributed optimizer's state (flat slices; each parameter's step held by its stage), the
/// learning-rate schedule's position, the step and the data position.
struct train_state {
  cairn::state_dict model;
  cairn::factory optim;
  cairn::factory scheduler;
  std::int64_t step = 0;
  std::int64_t samples_seen = 0;  // data position: samples consumed so far
  static constexpr auto fields =
      cairn::field_names("model", "optim", "scheduler", "step", "samples_seen");
};

/// The model alone, keyed as LlamaForCausalLM's parameters ("model.layers.0.mlp.up_proj.weight"):
/// what is handed to `transformers` and what is imported from it.
struct model_only {
  cairn::state_dict model;
  static constexpr auto fields = cairn::field_names("model");
};

/// `transformers`' config.json for this model (LlamaConfig).
std::string hf_config_json(const gpt::config& c) {
  std::ostringstream j;
  j << "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
    << "  \"vocab_size\": " << c.vocab << ",\n  \"hidden_size\": " << c.width
    << ",\n  \"intermediate_size\": " << c.intermediate
    << ",\n  \"num_hidden_layers\": " << c.layers << ",\n  \"num_attention_heads\": " << c.heads
    << ",\n  \"num_key_value_heads\": " << c.heads
    << ",\n  \"max_position_embeddings\": " << c.context
    << ",\n  \"rms_norm_eps\": " << c.rms_norm_eps << ",\n  \"rope_theta\": " << c.rope_theta
    << ",\n  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": true,\n"
    << "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n  \"torch_dtype\": \"float32\"\n}\n";
  return j.str();
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Sample `s` of the synthetic token stream: a walk t -> 5t + 7 (mod vocab), one token in ten
/// replaced by noise. The same sample index gives the same tokens on any world size.
torch::Tensor sample_tokens(std::int64_t s, std::int64_t len, std::int64_t vocab) {
  torch::Tensor out = torch::empty({len}, torch::kLong);
  auto* p = out.data_ptr<std::int64_t>();
  std::int64_t t = static_cast<std::int64_t>(mix(static_cast<std::uint64_t>(s)) % vocab);
  for (std::int64_t i = 0; i < len; ++i) {
    p[i] = t;
    std::uint64_t h = mix(static_cast<std::uint64_t>(s) * 131 + static_cast<std::uint64_t>(i));
    t = h % 10 == 0 ? static_cast<std::int64_t>((h >> 8) % vocab) : (5 * t + 7) % vocab;
  }
  return out;
}

/// Micro-batch `g` of step `step`: [micro_batch, context + 1] tokens.
torch::Tensor micro_batch(const options& o, std::int64_t step, std::int64_t g) {
  std::vector<torch::Tensor> rows;
  for (std::int64_t i = 0; i < o.micro_batch; ++i)
    rows.push_back(sample_tokens((step * o.micro_batches + g) * o.micro_batch + i,
                                 o.model.context + 1, o.model.vocab));
  return torch::stack(rows);
}

/// Warmup, then cosine decay to a tenth of the peak at the last step.
double learning_rate(const options& o, std::int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  double progress = static_cast<double>(step - o.warmup) /
                    static_cast<double>(std::max<std::int64_t>(1, o.steps - o.warmup));
  return o.lr * (0.1 + 0.45 * (1 + std::cos(M_PI * std::min(1.0, progress))));
}

/// The learning-rate schedule as a libtorch scheduler: each `step()` sets the rate of step
/// `step_count_` (warmup, then cosine decay), so a resumed schedule needs only its step count
/// (`cairn::libtorch::scheduler_state`).
struct warmup_cosine : torch::optim::LRScheduler {
  warmup_cosine(torch::optim::Optimizer& opt, const options& o) : LRScheduler(opt), o(o) {}
  std::vector<double> get_lrs() override {
    return std::vector<double>(get_current_lrs().size(), learning_rate(o, step_count_));
  }
  const options& o;
};

/// One process's place: pipeline stage `pp.rank` of `pp.size`; in it, tensor-parallel rank
/// `tp.rank` of `tp.size` and data-parallel rank `dp_rank` of `dp_size` (Megatron's order:
/// tensor-parallel ranks adjacent, stages farthest apart).
struct layout {
  gpt::tp_group tp;
  gpt::pp_stage pp;
  MPI_Comm dp_comm = MPI_COMM_NULL;
  int dp_rank = 0, dp_size = 1;
};

layout make_layout(int tp_size, int pp_size, std::int64_t layers) {
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (tp_size < 1 || pp_size < 1 || world % (tp_size * pp_size) != 0)
    throw std::runtime_error("--tp times --pp must divide the number of processes");
  if (pp_size > layers) throw std::runtime_error("--pp must be at most the number of layers");
  layout l;
  const int per_stage = world / pp_size, in_stage = rank % per_stage;
  l.pp.rank = rank / per_stage;
  l.pp.size = pp_size;
  l.tp.rank = in_stage % tp_size;
  l.tp.size = tp_size;
  l.dp_rank = in_stage / tp_size;
  l.dp_size = per_stage / tp_size;
  MPI_Comm_split(MPI_COMM_WORLD, l.pp.rank * l.dp_size + l.dp_rank, l.tp.rank, &l.tp.comm);
  MPI_Comm_split(MPI_COMM_WORLD, l.pp.rank * tp_size + l.tp.rank, l.dp_rank, &l.dp_comm);
  MPI_Comm_split(MPI_COMM_WORLD, in_stage, l.pp.rank, &l.pp.comm);
  return l;
}

/// Sends `t` to stage `to` of the pipeline, as float.
void send_to_stage(const torch::Tensor& t, int to, const gpt::pp_stage& pp) {
  torch::Tensor c = t.detach().to(torch::kFloat32).contiguous();
  MPI_Send(c.data_ptr<float>(), static_cast<int>(c.numel()), MPI_FLOAT, to, 0, pp.comm);
}

/// Receives a float tensor of `shape` from stage `from` of the pipeline.
torch::Tensor receive_from_stage(std::vector<std::int64_t> shape,
                                 int from,
                                 const gpt::pp_stage& pp) {
  torch::Tensor t = torch::empty(shape);
  MPI_Recv(t.data_ptr<float>(), static_cast<int>(t.numel()), MPI_FLOAT, from, 0, pp.comm,
           MPI_STATUS_IGNORE);
  return t;
}

/// The slice [begin, end) of `n` elements data-parallel rank `r` of `dp` owns: about n / dp,
/// cut at multiples of 64 elements (possibly empty). Aligned cuts keep each element in the same
/// SIMD lane of libtorch's AdamW kernels whatever `dp` is, so the update is bit-identical.
cairn::flat_range owned(std::int64_t n, int r, int dp) {
  auto cut = [&](int k) { return std::min(n, (n * k / dp + 63) / 64 * 64); };
  return {cut(r), cut(r + 1)};
}

/// The trainer of one process: model, distributed optimizer, and the state tree over them.
struct trainer {
  const options& o;
  layout l;
  gpt::model net;
  cairn::libtorch::sharding placing;
  std::vector<cairn::libtorch::named_tensor> params;  // the model's, named, with placements
  std::vector<torch::Tensor> main;                    // this rank's slice of each parameter
  /// Where each parameter's gradient sits in the flat gradient, and how the parameter is cut
  /// over the data-parallel ranks (this rank's slice; every rank's sizes and offsets).
  struct slicing {
    std::int64_t offset = 0;
    cairn::flat_range mine;
    std::vector<int> counts, displs;
  };
  std::vector<slicing> slices_of;
  std::int64_t flat_numel = 0;  // elements of all parameters together
  std::unique_ptr<torch::optim::AdamW> opt;
  std::unique_ptr<cairn::libtorch::saved_scheduler<warmup_cosine>> schedule;
  train_state state;
  /// The last stage holds a copy of the embedding (the tied head's weight), never saved.
  bool tied_copy() const { return l.pp.size > 1 && l.pp.last(); }

  trainer(const options& opts)
      : o(opts),
        l(make_layout(o.tp, o.pp, o.model.layers)),
        net(o.model, l.tp, l.pp),
        placing(gpt::model_sharding(l.tp, l.dp_rank, l.pp.size > 1 && l.pp.last())) {
    if (o.bf16) net->to(torch::kBFloat16);
    for (auto& p : net->named_parameters())
      params.push_back({p.key(), p.value(), placing.place(p.key())});
    init_weights();
    // The distributed optimizer: AdamW over this rank's flat slice of every parameter. Slices
    // differ across data-parallel ranks, so only tensor-parallel replicas skip writing them.
    const auto slice_placing = gpt::model_sharding(l.tp, /*dp_rank=*/0, tied_copy());
    std::vector<cairn::libtorch::named_tensor> slices;
    for (auto& p : params) {
      slicing& sl = slices_of.emplace_back();
      sl.offset = flat_numel;
      flat_numel += p.tensor.numel();
      for (int r = 0; r < l.dp_size; ++r) {
        auto rr = owned(p.tensor.numel(), r, l.dp_size);
        sl.counts.push_back(static_cast<int>(rr.end - rr.begin));
        sl.displs.push_back(static_cast<int>(rr.begin));
        if (r == l.dp_rank) sl.mine = rr;
      }
      auto r = sl.mine;
      main.push_back(p.tensor.detach()
                         .reshape(-1)
                         .narrow(0, r.begin, r.end - r.begin)
                         .clone()
                         .to(torch::kFloat32));
      cairn::libtorch::placement place = slice_placing.place(p.name);
      place.block_shape = cairn::shape(p.tensor.sizes().begin(), p.tensor.sizes().end());
      place.flat = r;
      slices.push_back({p.name, main.back(), place});
    }
    opt = std::make_unique<torch::optim::AdamW>(
        main, torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).weight_decay(0.1));
    schedule = std::make_unique<cairn::libtorch::saved_scheduler<warmup_cosine>>(*opt, o);
    state.model = cairn::libtorch::module_state(*net, placing);
    // In mixed precision the slices are the fp32 masters, saved with the optimizer's state
    // (state.<name>.fp32_param): a resume continues from them, not from the bf16 model.
    state.optim = cairn::libtorch::optimizer_state(*opt, slices, {.masters = o.bf16});
    state.scheduler = cairn::libtorch::scheduler_state(*schedule);
  }

  /// Each parameter is this rank's piece of a global tensor drawn from (seed, name): the same
  /// model on any number of tensor-parallel ranks.
  void init_weights() {
    torch::NoGradGuard no_grad;
    for (auto& p : params) {
      std::vector<std::int64_t> global(p.tensor.sizes().begin(), p.tensor.sizes().end());
      for (auto& s : p.place.splits) global[static_cast<std::size_t>(s.axis)] *= s.count;
      torch::Tensor full;
      if (p.name.find("norm") != std::string::npos) {  // RMSNorm weights start at one
        full = torch::ones(global);
      } else {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(
            mix(static_cast<std::uint64_t>(o.seed) ^ std::hash<std::string>{}(p.name)));
        full = torch::randn(global, gen) * 0.02;
      }
      for (auto& s : p.place.splits)
        full = full.narrow(s.axis, s.index * p.tensor.size(s.axis), p.tensor.size(s.axis));
      p.tensor.copy_(full);
    }
  }

  /// After loading a model alone: this rank's slices of the main parameters from it.
  void refresh_slices() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto r = slices_of[i].mine;
      main[i].copy_(params[i].tensor.reshape(-1).narrow(0, r.begin, r.end - r.begin));
    }
  }

  /// Forward and backward of micro-batch `g` of the current step through this stage: the first
  /// stage embeds the tokens, each stage runs its layers and passes the hidden states on, the
  /// last computes the loss (returned; 0 elsewhere); gradients go back stage by stage.
  double micro_batch_pass(std::int64_t g) {
    const std::int64_t T = o.model.context;
    const bool first = l.pp.first(), last = l.pp.last();
    torch::Tensor tokens = micro_batch(o, state.step, g);
    // The hidden states from the previous stage: a leaf whose gradient goes back to it.
    torch::Tensor input = stage_input(tokens.narrow(1, 0, T));  // a leaf on stages after the first
    if (!first) input.requires_grad_(true);
    torch::Tensor x = net->blocks(input);
    double loss_value = 0;
    if (last) {
      torch::Tensor logits = net->head(x).to(torch::kFloat32);  // the loss in fp32
      torch::Tensor loss = torch::nn::functional::cross_entropy(logits.reshape({-1, o.model.vocab}),
                                                                tokens.narrow(1, 1, T).reshape(-1));
      (loss / static_cast<double>(o.micro_batches)).backward();
      loss_value = loss.item<double>();
    } else {
      send_to_stage(x, l.pp.rank + 1, l.pp);
      x.backward(receive_from_stage(x.sizes().vec(), l.pp.rank + 1, l.pp).to(x.scalar_type()));
    }
    if (!first) send_to_stage(input.grad(), l.pp.rank - 1, l.pp);
    return loss_value;
  }

  /// One optimizer step; returns the mean loss over the step's micro-batches. Gradients of the
  /// micro-batches are gathered and summed in micro-batch order, so the step does not depend on
  /// how many data-parallel ranks share them; the tied embedding's two parts (the first stage's
  /// lookup, the last stage's head) are added per micro-batch, as autograd adds them in one
  /// stage, so the step does not depend on the number of stages either.
  double step() {
    const std::int64_t G = o.micro_batches;
    if (G % l.dp_size != 0)
      throw std::runtime_error("data-parallel size must divide --micro-batches");
    const std::int64_t mine = G / l.dp_size, first = l.dp_rank * mine;
    torch::Tensor rows = torch::zeros({G, flat_numel});
    torch::Tensor losses = torch::zeros({G}, torch::kDouble);
    for (std::int64_t g = first; g < first + mine; ++g) {
      net->zero_grad();
      losses[g] = micro_batch_pass(g);
      for (std::size_t i = 0; i < params.size(); ++i)
        rows[g]
            .narrow(0, slices_of[i].offset, params[i].tensor.numel())
            .copy_(params[i].tensor.grad().reshape(-1));
    }
    if (l.pp.size > 1 && (l.pp.first() || l.pp.last())) add_tied_gradients(rows, first, mine);
    // Every micro-batch's gradient on every data-parallel rank, then one sum in fixed order.
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, rows.data_ptr<float>(),
                  static_cast<int>(mine * flat_numel), MPI_FLOAT, l.dp_comm);
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, losses.data_ptr<double>(),
                  static_cast<int>(mine), MPI_DOUBLE, l.dp_comm);
    // The losses are the last stage's: every stage logs them.
    MPI_Bcast(losses.data_ptr<double>(), static_cast<int>(G), MPI_DOUBLE, l.pp.size - 1, l.pp.comm);
    torch::Tensor grad = rows[0].clone();
    for (std::int64_t g = 1; g < G; ++g) grad.add_(rows[g]);
    double mean = 0;
    for (std::int64_t g = 0; g < G; ++g) mean += losses[g].item<double>();
    // The distributed optimizer updates this rank's slices, then every rank gathers them.
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto r = slices_of[i].mine;
      main[i].mutable_grad() = grad.narrow(0, slices_of[i].offset + r.begin, r.end - r.begin);
    }
    schedule->step();  // this step's learning rate
    opt->step();
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!o.bf16) {
        gather_slices(i, params[i].tensor);
      } else {
        params[i].tensor.copy_(masters(i));  // rounded to bf16
      }
    }
    state.step += 1;
    state.samples_seen += G * o.micro_batch;
    return mean / static_cast<double>(G);
  }

  /// Every data-parallel rank's slice of parameter `i` gathered into `out` (F32, its shape).
  void gather_slices(std::size_t i, torch::Tensor& out) {
    MPI_Allgatherv(main[i].data_ptr<float>(), static_cast<int>(main[i].numel()), MPI_FLOAT,
                   out.data_ptr<float>(), slices_of[i].counts.data(), slices_of[i].displs.data(),
                   MPI_FLOAT, l.dp_comm);
  }

  /// The fp32 masters of parameter `i` (this rank's tensor-parallel piece, whole).
  torch::Tensor masters(std::size_t i) {
    torch::Tensor out = torch::empty(params[i].tensor.sizes(), torch::kFloat32);
    gather_slices(i, out);
    return out;
  }

  /// The first and last stages swap their rows of the embedding's gradient for this rank's
  /// micro-batches [first, first + count) and each adds the other's (the same sum on both).
  void add_tied_gradients(torch::Tensor& rows, std::int64_t first, std::int64_t count) {
    std::size_t e = 0;
    while (params[e].name != "embed_tokens.weight") ++e;
    torch::Tensor part =
        rows.narrow(0, first, count).narrow(1, slices_of[e].offset, params[e].tensor.numel());
    torch::Tensor own = part.contiguous(), other = torch::empty_like(own);
    const int peer = l.pp.first() ? l.pp.size - 1 : 0;
    MPI_Sendrecv(own.data_ptr<float>(), static_cast<int>(own.numel()), MPI_FLOAT, peer, 1,
                 other.data_ptr<float>(), static_cast<int>(other.numel()), MPI_FLOAT, peer, 1,
                 l.pp.comm, MPI_STATUS_IGNORE);
    part.copy_(own + other);
  }

  /// This stage's input for `tokens` [B, T]: on the first stage their embeddings, on the
  /// others the hidden states [B, T, width] received from the previous stage.
  torch::Tensor stage_input(const torch::Tensor& tokens) {
    if (l.pp.first()) return net->embed(tokens);
    return receive_from_stage({tokens.size(0), tokens.size(1), o.model.width}, l.pp.rank - 1, l.pp)
        .to(o.bf16 ? torch::kBFloat16 : torch::kFloat32);
  }

  /// Logits (F32) of a fixed evaluation batch, on the first stage (passed through the pipeline
  /// and back from the last stage; an empty tensor on the other stages).
  torch::Tensor eval_logits() {
    torch::NoGradGuard no_grad;
    torch::Tensor tokens = eval_tokens(o);
    torch::Tensor x = net->blocks(stage_input(tokens));
    if (!l.pp.last()) send_to_stage(x, l.pp.rank + 1, l.pp);
    if (l.pp.size == 1) return net->head(x).to(torch::kFloat32);
    if (l.pp.last()) send_to_stage(net->head(x), 0, l.pp);
    if (l.pp.first())
      return receive_from_stage({tokens.size(0), tokens.size(1), o.model.vocab}, l.pp.size - 1,
                                l.pp);
    return torch::zeros({0});
  }

  /// The fp32 masters of this stage's parameters under the model's keys, saved in `dir` (what
  /// `cairn unshard --fp32-masters` should recover from the checkpoint of this step).
  void save_masters(const fs::path& dir, cairn::mpi_communicator& comm) {
    model_only m;
    for (std::size_t i = 0; i < params.size(); ++i)
      m.model.add(params[i].name, cairn::libtorch::tensor(masters(i), params[i].place));
    cairn::file_storage out(dir);
    cairn::save_options so;
    so.overwrite = true;
    cairn::save(m, out, comm, so);
  }

  static torch::Tensor eval_tokens(const options& o) {
    std::vector<torch::Tensor> rows;
    for (std::int64_t i = 0; i < 3; ++i)
      rows.push_back(sample_tokens(1'000'000'000 + i, o.model.context, o.model.vocab));
    return torch::stack(rows);
  }
};

/// Checkpoints under DIR/ckpt: every --save-every steps, in the background, keeping three.
cairn::checkpointer_options checkpointing(int world, int tp, int pp) {
  cairn::checkpointer_options c;
  c.name = "step_{step:06}";
  c.keep_last = 3;
  c.async = true;
  c.overwrite = true;
  c.save.content_metadata = {{"example", "gpt_trainer"},
                             {"world_size", std::to_string(world)},
                             {"tensor_parallel", std::to_string(tp)},
                             {"pipeline_parallel", std::to_string(pp)}};
  return c;
}

void write_file(const fs::path& p, const void* data, std::size_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

/// Runs one phase on this process.
int run(const options& o) {
  int rank = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  torch::set_num_threads(1);  // ranks share the machine's cores
  cairn::mpi_communicator comm(MPI_COMM_WORLD);
  trainer t(o);
  // resume_<processes>x<tp>, with p<pp> for pipelines: resume_4x2p2; mixed precision runs
  // begin with bf16_: bf16_train, bf16_resume_2x2.
  const std::string stages = o.pp > 1 ? "p" + std::to_string(o.pp) : "";
  const std::string label =
      (o.bf16 ? "bf16_" : "") +
      (o.phase == "resume" || o.phase == "import"
           ? o.phase + "_" + std::to_string(world) + "x" + std::to_string(o.tp) + stages
           : o.phase + (stages.empty() ? "" : "_" + stages));
  if (rank == 0) fs::create_directories(o.dir);
  MPI_Barrier(MPI_COMM_WORLD);
  cairn::file_storage root(o.dir / o.ckpt);
  cairn::checkpointer ckpt(root, comm, checkpointing(world, o.tp, o.pp));
  // The trainer's own fp32 masters, saved beside each checkpoint of a mixed-precision run
  // (DIR/masters_<ckpt>/<name>) to check `cairn unshard --fp32-masters` against; on a
  // communicator of their own, since the checkpointer's commit runs on another thread.
  cairn::mpi_communicator side(MPI_COMM_WORLD);
  std::FILE* log =
      rank == 0 ? std::fopen((o.dir / ("loss_" + label + ".txt")).c_str(), "w") : nullptr;
  if (o.phase == "import") {
    // A model `transformers` saved (safetensors, any sharding) loads on this tensor-parallel
    // size; training starts from it with a fresh optimizer.
    cairn::file_storage hf(o.from);
    model_only m{cairn::libtorch::module_state(*t.net, t.placing)};
    cairn::load(m, hf, comm);
    t.refresh_slices();
    torch::Tensor logits = t.eval_logits().contiguous();
    if (rank == 0) {
      write_file(o.dir / ("logits_" + label + "_initial.bin"), logits.data_ptr<float>(),
                 static_cast<std::size_t>(logits.numel()) * sizeof(float));
      std::printf("[%s] imported %s on %d ranks (tp %d x pp %d x dp %d)\n", label.c_str(),
                  o.from.c_str(), world, t.l.tp.size, t.l.pp.size, t.l.dp_size);
    }
  }
  if (o.phase == "resume") {
    auto loaded = ckpt.load_latest(t.state).value();
    if (!loaded)
      throw std::runtime_error("no checkpoint to resume from in " + (o.dir / o.ckpt).string());
    if (!o.bf16) t.refresh_slices();  // mixed precision loaded its fp32 masters
    if (rank == 0)
      std::printf("[%s] resumed %s/%s at step %" PRId64 " (%" PRId64
                  " samples seen) on %d ranks (tp %d x pp %d x dp %d)\n",
                  label.c_str(), o.ckpt.c_str(), loaded->name.c_str(), t.state.step,
                  t.state.samples_seen, world, t.l.tp.size, t.l.pp.size, t.l.dp_size);
  }
  const std::int64_t stop = o.phase == "train" ? o.interrupt_at : o.steps;
  while (t.state.step < stop) {
    double loss = t.step();
    if (log) std::fprintf(log, "%" PRId64 " %.9g %a\n", t.state.step, loss, loss);
    if (rank == 0 && (t.state.step % 10 == 0 || t.state.step == stop))
      std::printf("[%s] step %" PRId64 " loss %.4f lr %.2e\n", label.c_str(), t.state.step, loss,
                  learning_rate(o, t.state.step - 1));
    if (o.phase == "train" && t.state.step % o.save_every == 0) {
      cairn::saved_checkpoint saved = ckpt.save(t.state, {.step = t.state.step});
      if (o.bf16) t.save_masters(o.dir / ("masters_" + o.ckpt) / saved.name, side);
    }
  }
  if (log) std::fclose(log);
  if (o.phase == "train") {
    // Stopped with a save in flight, never finalized: the checkpointer's destructor waits for
    // it, committed from the background thread (MPI_THREAD_MULTIPLE).
    if (rank == 0)
      std::printf("[%s] interrupted at step %" PRId64 " with a save in flight\n", label.c_str(),
                  t.state.step);
    return 0;
  }
  // The final state, for the comparisons and for Python: DIR/final_<label>; the model alone
  // (what `cairn convert` hands to transformers) in DIR/model_<label>, with DIR/config.json.
  cairn::file_storage fin(o.dir / ("final_" + label));
  cairn::save_options so;
  so.overwrite = true;
  cairn::save(t.state, fin, comm, so);
  cairn::file_storage model_dir(o.dir / ("model_" + label));
  cairn::save(model_only{cairn::libtorch::module_state(*t.net, t.placing)}, model_dir, comm, so);
  if (rank == 0) {
    const std::string cfg = hf_config_json(o.model);
    write_file(o.dir / "config.json", cfg.data(), cfg.size());
  }
  torch::Tensor logits = t.eval_logits().contiguous();
  if (rank == 0) {
    write_file(o.dir / ("logits_" + label + ".bin"), logits.data_ptr<float>(),
               static_cast<std::size_t>(logits.numel()) * sizeof(float));
    torch::Tensor tokens = trainer::eval_tokens(o).contiguous();
    write_file(o.dir / "eval_tokens.bin", tokens.data_ptr<std::int64_t>(),
               static_cast<std::size_t>(tokens.numel()) * sizeof(std::int64_t));
    std::printf("[%s] finished at step %" PRId64 "; final state in %s\n", label.c_str(),
                t.state.step, (o.dir / ("final_" + label)).c_str());
  }
  return 0;
}

/// The loss curve of a run: step -> (loss, its exact bits as text).
std::map<std::int64_t, std::pair<double, std::string>> read_losses(const fs::path& p) {
  std::map<std::int64_t, std::pair<double, std::string>> out;
  std::ifstream f(p);
  std::int64_t step = 0;
  double loss = 0;
  std::string hex;
  while (f >> step >> loss >> hex) out[step] = {loss, hex};
  return out;
}

/// The largest difference from the reference's loss a run at another tensor-parallel size may
/// show at any step (its sums are split differently, so the last bits differ and may grow): in
/// fp32, and in mixed precision, where a bf16 activation carries 8 significant bits.
constexpr double tensor_parallel_loss_bound = 1e-4, bf16_tensor_parallel_loss_bound = 1e-2;

/// Compares the loss curves `names` (files in DIR) with `ref`'s from the step each resumed
/// at: equal bits when the tensor-parallel size is `tp` (whatever the pipeline and
/// data-parallel sizes), within `bound` otherwise. Returns how many resumed runs it compared,
/// or -1 after a mismatch.
int compare_curves(const options& o,
                   const std::string& ref_name,
                   const std::vector<std::string>& names,
                   double bound) {
  auto ref = read_losses(o.dir / ref_name);
  int runs = 0;
  bool all = true;
  for (const std::string& name : names) {
    auto got = read_losses(o.dir / name);
    const bool resumed = name.find("_resume_") != std::string::npos;
    runs += resumed;
    // loss_[bf16_]resume_<processes>x<tp>[p<pp>].txt; the interrupted runs: the reference's tp
    const std::string layout = name.substr(name.find('x') + 1);
    bool same_tp = !resumed || layout.substr(0, layout.find_first_of("p.")) == std::to_string(o.tp);
    int exact = 0, steps = 0;
    double worst = 0;
    for (const auto& [step, v] : got) {
      auto it = ref.find(step);
      if (it == ref.end()) continue;
      ++steps;
      exact += v.second == it->second.second;
      worst = std::max(worst, std::abs(v.first - it->second.first));
    }
    bool ok = steps > 0 && (same_tp ? exact == steps : worst <= bound);
    std::printf("%s against %s: %d steps %s, %d bit-exact, largest loss difference %.3g -> %s\n",
                name.c_str(), ref_name.c_str(), steps,
                resumed ? "after the resume" : "before the interruption", exact, worst,
                ok ? (exact == steps ? "bit-exact"
                                     : "continues the curve (tensor-parallel size "
                                       "changed: sums split differently)")
                   : "MISMATCH");
    all = all && ok;
  }
  return all ? runs : -1;
}

/// Compares each resumed run's loss curve with the uninterrupted reference's (fp32), and each
/// mixed-precision resume with the interrupted mixed-precision run's steps after its
/// checkpoint (loss_bf16_train.txt; a resume must continue from the fp32 masters, not from the
/// bf16 model). The interrupted fp32 runs (at the reference's tensor-parallel size in run.sh,
/// with or without a pipeline) are compared too; their exactness is what the resumes from
/// their checkpoints build on.
int compare(const options& o) {
  if (!fs::exists(o.dir / "loss_reference.txt"))
    throw std::runtime_error("no loss_reference.txt in " + o.dir.string());
  std::vector<std::string> fp32, bf16;
  for (const auto& e : fs::directory_iterator(o.dir)) {
    std::string name = e.path().filename().string();
    if (name.starts_with("loss_resume_") || name.starts_with("loss_train")) fp32.push_back(name);
    if (name.starts_with("loss_bf16_resume_")) bf16.push_back(name);
  }
  std::sort(fp32.begin(), fp32.end());
  std::sort(bf16.begin(), bf16.end());
  int runs = compare_curves(o, "loss_reference.txt", fp32, tensor_parallel_loss_bound);
  if (runs <= 0) return 1;
  if (!bf16.empty() &&
      compare_curves(o, "loss_bf16_train.txt", bf16, bf16_tensor_parallel_loss_bound) <= 0)
    return 1;
  return 0;
}

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return false;
    std::string v = argv[++i];
    auto num = [&] { return std::stoll(v); };
    if (a == "--phase")
      o.phase = v;
    else if (a == "--dir")
      o.dir = v;
    else if (a == "--tp")
      o.tp = static_cast<int>(num());
    else if (a == "--pp")
      o.pp = static_cast<int>(num());
    else if (a == "--ckpt")
      o.ckpt = v;
    else if (a == "--steps")
      o.steps = num();
    else if (a == "--interrupt-at")
      o.interrupt_at = num();
    else if (a == "--save-every")
      o.save_every = num();
    else if (a == "--micro-batches")
      o.micro_batches = num();
    else if (a == "--layers")
      o.model.layers = num();
    else if (a == "--width")
      o.model.width = num();
    else if (a == "--from")
      o.from = v;
    else if (a == "--precision" && (v == "bf16" || v == "fp32"))
      o.bf16 = v == "bf16";
    else
      return false;
  }
  return !o.phase.empty() && (o.phase != "import" || !o.from.empty());
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(
        stderr,
        "usage: gpt_trainer --phase reference|train|resume|compare|import [--tp N] [--pp N] "
        "[--dir DIR] [--ckpt NAME] "
        "[--steps N] [--interrupt-at N] [--save-every N] [--micro-batches N] "
        "[--layers N] [--width N] [--from HF_DIR] [--precision fp32|bf16]\n");
    return 2;
  }
  try {
    if (o.phase == "compare") return compare(o);
    cairn::mpi_environment env(argc, argv);
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_trainer: %s\n", e.what());
    return 1;
  }
}
