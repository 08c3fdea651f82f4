"""The algorithm as tensor math: PPO's losses and GAE, observation and return statistics, sampling noise."""
