#!/usr/bin/env node
// A lockstep actor in Node.js that shares no code with lockstep: it loads lockstep.proto at start,
// steps CartPole written in JavaScript below, and lets the learner choose every action
// (the protocol: docs/protocol.md).
//
//   node actor.js --learner 127.0.0.1:50051 --token SECRET --num-envs 8
//
// Exit codes, as `lockstep actor`'s: 0 training finished, 1 no learner (any more), 2 refused for good.
"use strict";

const fs = require("fs");
const path = require("path");
const crypto = require("crypto");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO = path.resolve(__dirname, "../../src/lockstep/transport/lockstep.proto");
const PROTOCOL = 1; // Hello.protocol: the revision of lockstep.proto this actor speaks
// Refusals after which reconnecting cannot help (docs/protocol.md, "Statuses")
const FATAL = new Set(["INVALID_ARGUMENT", "FAILED_PRECONDITION", "ALREADY_EXISTS", "UNAUTHENTICATED",
  "PERMISSION_DENIED", "UNIMPLEMENTED"]);

// ---- CartPole-v1, Gymnasium's equations and constants (euler integration, 500 steps) ----------------------
const GRAVITY = 9.8, MASS_CART = 1.0, MASS_POLE = 0.1, TOTAL_MASS = MASS_POLE + MASS_CART;
const LENGTH = 0.5, POLE_MASS_LENGTH = MASS_POLE * LENGTH, FORCE_MAG = 10.0, TAU = 0.02;
const THETA_THRESHOLD = 12 * 2 * Math.PI / 360, X_THRESHOLD = 2.4, MAX_STEPS = 500;
// The observation space the learner's CartPole-v1 has: Box(low, high, (4,), float32); the hello must equal it
const OBS_HIGH = [X_THRESHOLD * 2, Infinity, THETA_THRESHOLD * 2, Infinity];
const OBS_LOW = OBS_HIGH.map((v) => -v);

// mulberry32: a small seeded generator, one per env, so that a run's envs are reproducible from the welcome's seed
function generator(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class CartPole {
  constructor(seed) {
    this.random = generator(seed);
    this.reset();
  }

  reset() {
    this.state = [0, 0, 0, 0].map(() => this.random() * 0.1 - 0.05);
    this.steps = 0;
    this.return = 0;
    return this.state.slice();
  }

  // -> [observation, reward, terminated, truncated]
  step(action) {
    let [x, xDot, theta, thetaDot] = this.state;
    const force = action === 1 ? FORCE_MAG : -FORCE_MAG;
    const cos = Math.cos(theta), sin = Math.sin(theta);
    const temp = (force + POLE_MASS_LENGTH * thetaDot * thetaDot * sin) / TOTAL_MASS;
    const thetaAcc = (GRAVITY * sin - cos * temp) / (LENGTH * (4.0 / 3.0 - MASS_POLE * cos * cos / TOTAL_MASS));
    const xAcc = temp - POLE_MASS_LENGTH * thetaAcc * cos / TOTAL_MASS;
    x += TAU * xDot;
    xDot += TAU * xAcc;
    theta += TAU * thetaDot;
    thetaDot += TAU * thetaAcc;
    this.state = [x, xDot, theta, thetaDot];
    this.steps += 1;
    this.return += 1.0;
    const terminated = x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD || theta > THETA_THRESHOLD;
    const truncated = this.steps >= MAX_STEPS;
    return [this.state.slice(), 1.0, terminated, truncated];
  }
}

// ---- Tensors: raw little-endian bytes, C order, with the numpy dtype name and the shape -------------------
const WRITERS = {
  float32: [4, (v, o, x) => v.setFloat32(o, x, true)],
  float64: [8, (v, o, x) => v.setFloat64(o, x, true)],
  int64: [8, (v, o, x) => v.setBigInt64(o, BigInt(x), true)],
  bool: [1, (v, o, x) => v.setUint8(o, x ? 1 : 0)],
};

function tensor(dtype, shape, values) {
  const [size, write] = WRITERS[dtype];
  const data = Buffer.alloc(values.length * size);
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  values.forEach((x, i) => write(view, i * size, x));
  return { dtype, shape, data };
}

function int64s(t) { // an int64 Tensor -> numbers
  const view = new DataView(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  return Array.from({ length: t.data.byteLength / 8 }, (_, i) => Number(view.getBigInt64(i * 8, true)));
}

// ---- The vector of envs: same-step autoreset, and what the next Step must report --------------------------
class Envs {
  constructor(k, seed, actorId) {
    this.envs = Array.from({ length: k }, (_, i) => new CartPole(envSeed(seed, actorId, i)));
    this.obs = this.envs.map((env) => env.state.slice());
    this.forget();
  }

  forget() { // nothing to report: the first Step of a connection
    const k = this.envs.length;
    this.reward = new Array(k).fill(0);
    this.terminated = new Array(k).fill(false);
    this.truncated = new Array(k).fill(false);
    this.finalIndex = [];
    this.finalObs = [];
    this.returns = [];
    this.lengths = [];
  }

  step(actions) {
    this.forget();
    this.envs.forEach((env, i) => {
      const [obs, reward, terminated, truncated] = env.step(actions[i]);
      this.reward[i] = reward;
      this.terminated[i] = terminated;
      this.truncated[i] = truncated;
      if (terminated || truncated) {
        this.returns.push(env.return);
        this.lengths.push(env.steps);
        if (truncated && !terminated) { // cut by time: the learner bootstraps from this last observation
          this.finalIndex.push(i);
          this.finalObs.push(...obs);
        }
        this.obs[i] = env.reset(); // the observation the next action is for starts a new episode
      } else {
        this.obs[i] = obs;
      }
    });
  }

  message() {
    const k = this.envs.length, m = this.finalIndex.length, e = this.returns.length;
    return {
      step: {
        observation: tensor("float32", [k, 4], this.obs.flat()),
        reward: tensor("float32", [k], this.reward),
        terminated: tensor("bool", [k], this.terminated),
        truncated: tensor("bool", [k], this.truncated),
        final_index: tensor("int64", [m], this.finalIndex),
        final_observation: tensor("float32", [m, 4], this.finalObs),
        episode_return: tensor("float64", [e], this.returns),
        episode_length: tensor("int64", [e], this.lengths),
      },
    };
  }
}

function envSeed(seed, actorId, i) { // any function of (seed, actor, env) will do; this one mixes all three
  const digest = crypto.createHash("sha256").update(`${seed}/${actorId}/${i}`).digest();
  return digest.readUInt32LE(0);
}

function hello(opts) {
  return {
    hello: {
      protocol: PROTOCOL, actor_id: opts.actorId, run_id: crypto.randomUUID().replace(/-/g, ""),
      num_envs: opts.numEnvs, env_id: "CartPole-v1",
      observation_space: {
        kind: "BOX", shape: [4], dtype: "float32",
        low: tensor("float32", [4], OBS_LOW), high: tensor("float32", [4], OBS_HIGH),
      },
      action_space: { kind: "DISCRETE", dtype: "int64", n: 2 },
    },
  };
}

// ---- One connection: hello, welcome, then a Step per Action until the learner ends the stream -------------
function connect(client, opts, state) {
  return new Promise((resolve) => {
    const metadata = new grpc.Metadata();
    if (opts.token) metadata.set("authorization", `Bearer ${opts.token}`);
    const call = client.Connect(metadata);
    call.write(hello(opts)); // the first message; a new run id on every connection
    let settled = false;
    const done = (result) => { if (!settled) { settled = true; resolve(result); } };
    call.on("data", (msg) => {
      if (msg.welcome) {
        if (!state.envs) {
          state.envs = new Envs(opts.numEnvs, msg.welcome.seed, opts.actorId);
        } else {
          state.envs.forget(); // a new connection: the learner dropped the unroll the last outcome belongs to
        }
        console.error(`actor ${opts.actorId}: connected (learner run ${msg.welcome.learner_run})`);
        call.write(state.envs.message());
      } else if (msg.action) {
        if (msg.action.retry) { // "no action, send the same Step again" (the benchmarks' reference strategies)
          call.write(state.envs.message());
          return;
        }
        state.acted = true;
        state.version = Number(msg.action.policy_version);
        state.envs.step(int64s(msg.action.action));
        call.write(state.envs.message());
      }
    });
    // the stream's status says how it ended: OK when training is over, else why (docs/protocol.md)
    call.on("error", (err) => done({ code: grpc.status[err.code], details: err.details }));
    call.on("status", (status) => done({ code: grpc.status[status.code], details: status.details }));
  });
}

function options(argv) {
  const opts = { learner: "127.0.0.1:50051", token: process.env.LOCKSTEP_TOKEN || "", numEnvs: 8, actorId: 0,
    retryFor: 60, tlsCa: "" };
  const names = { "--learner": "learner", "--token": "token", "--num-envs": "numEnvs", "--actor-id": "actorId",
    "--retry-for": "retryFor", "--tls-ca": "tlsCa" };
  for (let i = 0; i < argv.length; i += 2) {
    const key = names[argv[i]];
    if (!key || argv[i + 1] === undefined) {
      console.error(`usage: node actor.js [--learner HOST:PORT] [--token T] [--num-envs K] [--actor-id N] ` +
        `[--retry-for SECONDS] [--tls-ca CA.pem]; got ${argv[i]}`);
      process.exit(2);
    }
    opts[key] = ["numEnvs", "actorId", "retryFor"].includes(key) ? Number(argv[i + 1]) : argv[i + 1];
  }
  return opts;
}

async function main() {
  const opts = options(process.argv.slice(2));
  const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String, enums: String, defaults: true });
  const { Learner } = grpc.loadPackageDefinition(definition).lockstep.v1;
  const credentials = opts.tlsCa ? grpc.credentials.createSsl(fs.readFileSync(opts.tlsCa))
    : grpc.credentials.createInsecure();
  const client = new Learner(opts.learner, credentials, {
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
    "grpc.max_send_message_length": 64 * 1024 * 1024,
    "grpc.keepalive_time_ms": 10000, // notice a vanished learner, also while a request is held
    "grpc.keepalive_timeout_ms": 5000,
    "grpc.keepalive_permit_without_calls": 1,
  });
  const state = { envs: null, acted: false, version: -1 };
  let lostSince = Date.now(), wait = 500;
  for (;;) {
    state.acted = false;
    const { code, details } = await connect(client, opts, state);
    if (code === "OK") {
      console.error(`actor ${opts.actorId}: the learner finished training (last policy version ${state.version})`);
      return 0;
    }
    if (FATAL.has(code)) {
      console.error(`actor ${opts.actorId}: the learner refused this actor: ${code}: ${details}`);
      return 2;
    }
    if (state.acted) { lostSince = Date.now(); wait = 500; }
    if (Date.now() - lostSince > opts.retryFor * 1000) {
      console.error(`actor ${opts.actorId}: no learner at ${opts.learner} for ${opts.retryFor} s (${code}: ${details})`);
      return 1;
    }
    console.error(`actor ${opts.actorId}: ${code}: ${details}; reconnecting with a new run id`);
    await new Promise((r) => setTimeout(r, Math.random() * wait)); // backoff with full jitter
    wait = Math.min(wait * 2, 10000);
  }
}

main().then((code) => process.exit(code));
