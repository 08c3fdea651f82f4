"""The environments behind the env-id schemes of ``lockstep.envs``, built on the actor side (numpy and
Gymnasium only, never torch):

- ``atari``: ``atari:GAME``, ALE games with the DQN preprocessing
- ``minatar``: ``minatar:GAME``, the MinAtar games, channels first
- ``masked``: ``masked:ENV``, control envs with their velocities hidden
"""
