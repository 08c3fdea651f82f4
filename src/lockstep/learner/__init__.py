"""The learner: sessions, backends, batched inference, rollouts, training and checkpoints,
wired together by ``wiring.Learner``."""
