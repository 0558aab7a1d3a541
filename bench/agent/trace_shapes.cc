// Trace shapes that mimic production LLM traffic (see trace.h). Block keys are chained as a
// prefix-caching engine chains them (vLLM, Mooncake's hash_ids): a block's key is a hash of its
// parent's key and its own content, so the same document behind a different prefix is a
// different block, as it is in a real KV cache.
//
// The sizes are picked so that the distinct blocks of a 20000-request trace are tens of
// thousands to a few hundred thousand: caches of 2-10% of them are the regime of a CPU tier in
// front of a large working set, and a replay of every policy fits `make bench`'s budget.
#include <cstdint>
#include <queue>
#include <vector>

#include "rng.h"
#include "trace.h"

namespace kvoffload::bench {
namespace {

// What a block holds, before chaining: its kind in the top byte, then an object id and index.
enum Content : uint64_t { kSystem = 1, kTurn = 2, kDocument = 3, kTool = 4, kQuestion = 5 };

uint64_t ContentId(Content kind, uint64_t object, uint64_t index) {
  return (static_cast<uint64_t>(kind) << 56) | (object << 16) | (index & 0xFFFF);
}

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// Appends the blocks of one request, each chained to the one before it.
class Chain {
 public:
  explicit Chain(TraceRequest& request) : request_(request) {}
  void Append(Content kind, uint64_t object, size_t blocks, size_t first_index = 0) {
    for (size_t b = 0; b < blocks; ++b) {
      const uint64_t content = ContentId(kind, object, first_index + b);
      parent_ = Mix(parent_ ^ Mix(content + 0x9E3779B97F4A7C15ULL));
      request_.blocks.push_back(BlockKey{kShapeTag, parent_});
    }
  }

 private:
  static constexpr uint64_t kShapeTag = 0x5348415045000000ULL;  // "SHAPE": apart from other keys
  TraceRequest& request_;
  uint64_t parent_ = 0;
};

// A session's next request, ordered by time (earliest first) then by session for ties.
struct Event {
  double time_ms;
  size_t session;
  bool operator>(const Event& o) const {
    return time_ms != o.time_ms ? time_ms > o.time_ms : session > o.session;
  }
};
using EventQueue = std::priority_queue<Event, std::vector<Event>, std::greater<>>;

}  // namespace

// Multi-turn chat: sessions arrive at random (Poisson, 1.5 per second), each picks one of 24
// system prompts (Zipf 1.0, 8-24 blocks), and runs 1-16 turns. A turn re-reads the system prompt
// and the whole history, then appends the user's message (1-3 blocks) and the answer (1-3
// blocks). Between turns the user reads and types: 2 s of generation plus an exponential think
// time of mean 40 s, so several hundred sessions are open at once and a session's blocks come
// back after tens of thousands of other blocks went by.
Trace GenerateChatTrace(const ShapeOptions& o) {
  Rng rng(o.seed);
  constexpr size_t kPrompts = 24;
  const Zipf prompt_pick(kPrompts, 1.0);
  std::vector<size_t> prompt_blocks(kPrompts);
  for (size_t& b : prompt_blocks) b = rng.Between(8, 24);

  struct Session {
    size_t prompt;
    size_t turns_left;
    std::vector<std::pair<uint64_t, size_t>> turns;  // (turn content id, its blocks)
  };
  std::vector<Session> sessions;
  EventQueue events;
  double next_arrival = 0;
  Trace trace;
  while (trace.size() < o.requests) {
    if (events.empty() || next_arrival <= events.top().time_ms) {
      sessions.push_back(Session{prompt_pick.Sample(rng), rng.Between(1, 16), {}});
      events.push(Event{next_arrival, sessions.size() - 1});
      next_arrival += rng.Exponential(1000.0 / 1.5);
      continue;
    }
    const Event e = events.top();
    events.pop();
    Session& s = sessions[e.session];
    // This turn's new message: the request carries it, the answer joins the history after.
    s.turns.emplace_back(s.turns.size(), rng.Between(1, 3));
    TraceRequest& req = trace.emplace_back();
    req.timestamp_ms = e.time_ms;
    Chain chain(req);
    chain.Append(kSystem, s.prompt, prompt_blocks[s.prompt]);
    for (const auto& [turn, blocks] : s.turns) {
      chain.Append(kTurn, (e.session << 8) | (turn & 0xFF), blocks);
    }
    s.turns.back().second += rng.Between(1, 3);  // the answer
    if (--s.turns_left > 0)
      events.push(Event{e.time_ms + 2000 + rng.Exponential(40000), e.session});
  }
  return trace;
}

// Agentic tool loops: tasks arrive at random (Poisson, 0.5 per second), each for one of 6 agents
// whose system prompt and tool definitions are a long shared prefix (32-96 blocks). A task
// states its goal (2-6 blocks), then runs 4-40 steps; every step re-reads the whole context and
// appends the model's action (1 block) and the tool's result (1-6 blocks). Steps follow each
// other after a tool call of exponential mean 3 s, so about 30 tasks are open at once, their
// contexts growing to a few hundred blocks.
Trace GenerateAgentTrace(const ShapeOptions& o) {
  Rng rng(o.seed);
  constexpr size_t kAgents = 6;
  std::vector<size_t> prefix_blocks(kAgents);
  for (size_t& b : prefix_blocks) b = rng.Between(32, 96);
  const Zipf agent_pick(kAgents, 0.8);

  struct Task {
    size_t agent;
    size_t goal_blocks;
    size_t steps_left;
    std::vector<size_t> step_blocks;
  };
  std::vector<Task> tasks;
  EventQueue events;
  double next_arrival = 0;
  Trace trace;
  while (trace.size() < o.requests) {
    if (events.empty() || next_arrival <= events.top().time_ms) {
      tasks.push_back(Task{agent_pick.Sample(rng), rng.Between(2, 6), rng.Between(4, 40), {}});
      events.push(Event{next_arrival, tasks.size() - 1});
      next_arrival += rng.Exponential(1000.0 / 0.5);
      continue;
    }
    const Event e = events.top();
    events.pop();
    Task& t = tasks[e.session];
    TraceRequest& req = trace.emplace_back();
    req.timestamp_ms = e.time_ms;
    Chain chain(req);
    chain.Append(kTool, t.agent, prefix_blocks[t.agent]);
    chain.Append(kQuestion, e.session, t.goal_blocks);
    for (size_t step = 0; step < t.step_blocks.size(); ++step) {
      chain.Append(kTurn, (e.session << 8) | (step & 0xFF), t.step_blocks[step]);
    }
    t.step_blocks.push_back(1 + rng.Between(1, 6));  // action + tool result, read next step
    if (--t.steps_left > 0) events.push(Event{e.time_ms + 500 + rng.Exponential(3000), e.session});
  }
  return trace;
}

// Retrieval-augmented generation: requests arrive at random (Poisson, 20 per second), each
// with one of 4 system prompts (8 blocks), then the 3 best documents for its question out of
// 20000 (4-16 blocks each; the first by Zipf 0.9 popularity, the other two by a flatter Zipf
// 0.6, so the same leading document is common and the same three rare), then the question
// (1-2 blocks, never seen again). Only the blocks up to the first document that differs are
// shared with an earlier request.
Trace GenerateRagTrace(const ShapeOptions& o) {
  Rng rng(o.seed);
  constexpr size_t kDocuments = 20000;
  constexpr size_t kPrompts = 4;
  std::vector<size_t> doc_blocks(kDocuments);
  for (size_t& b : doc_blocks) b = rng.Between(4, 16);
  const Zipf first_pick(kDocuments, 0.9);
  const Zipf other_pick(kDocuments, 0.6);
  const Zipf prompt_pick(kPrompts, 1.0);
  Trace trace;
  double now = 0;
  for (size_t r = 0; r < o.requests; ++r) {
    now += rng.Exponential(1000.0 / 20);
    TraceRequest& req = trace.emplace_back();
    req.timestamp_ms = now;
    Chain chain(req);
    chain.Append(kSystem, prompt_pick.Sample(rng), 8);
    const size_t first = first_pick.Sample(rng);
    chain.Append(kDocument, first, doc_blocks[first]);
    for (int k = 0; k < 2; ++k) {
      const size_t doc = other_pick.Sample(rng);
      chain.Append(kDocument, doc, doc_blocks[doc]);
    }
    chain.Append(kQuestion, r, rng.Between(1, 2));
  }
  return trace;
}

}  // namespace kvoffload::bench
