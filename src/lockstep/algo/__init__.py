"""The algorithm as tensor math: PPO's losses and GAE, V-trace, observation and return statistics, sampling noise."""
