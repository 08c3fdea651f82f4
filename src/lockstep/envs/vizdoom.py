"""VizDoom (Kempka et al., 2016): first-person 3-D Doom scenarios, played from pixels.

``make_vizdoom(scenario)`` is what the env id ``vizdoom:SCENARIO`` builds, on ViZDoom's own ``DoomGame``:

- SCENARIO is one of the scenarios that ship inside the ``vizdoom`` package (``SCENARIOS``: ``basic``,
  ``health_gathering_supreme``, ``defend_the_center``, ``deadly_corridor``, ``my_way_home``, ...), or the path of
  a scenario ``.cfg`` file of your own (``vizdoom:/path/to/my.cfg``; its ``doom_scenario_path`` is relative to it)
- the game runs headless (no window, no sound, ``Mode.PLAYER``) and renders RGB at a low native resolution
  (``screen_resolution``, 160 x 120), which is shrunk in numpy to ``width`` x ``height`` (128 x 72, Sample
  Factory's Doom input) and sent channels first: Box(0, 255, (3, height, width), uint8). ``resize``: ``nearest``
  (the default, as Sample Factory resizes Doom frames: OpenCV's INTER_NEAREST, pixel ``floor(i * in / out)``) or
  ``area`` (averaging, OpenCV's INTER_AREA, ``atari.AreaResize``: smoother, and a step costs about 3 times more)
- each action is held for ``frame_skip`` tics (4) by ViZDoom itself (``make_action(buttons, tics)``), which
  returns the rewards of those tics summed
- actions: Discrete(1 + buttons): 0 presses nothing, action i presses the scenario's i-th available button
  (its cfg's ``available_buttons``, in order) alone; ``action_names`` lists them
- ``variables``: the observation is a Dict of the frame (``screen``) and the scenario's game variables (its
  cfg's ``available_game_variables``, e.g. HEALTH) as Box float32 (``vars``); by default only for the health
  gathering scenarios (``VARIABLES_BY_DEFAULT``), where health is what the agent must keep up
- episodes end as the scenario's cfg says: the player's death or the scenario's goal ends one (terminated), its
  ``episode_timeout`` (in tics) cuts it (truncated). ViZDoom draws no screen once an episode is over, so the last
  observation of an episode repeats the frame before it
- rewards are the scenario's own (e.g. basic: -1 a tic, +100 for the kill), unscaled
- ``reset(seed=...)`` seeds ViZDoom's random numbers (``DoomGame.set_seed``); a seeded env repeats its episodes
  under the same actions

Settings come as the env's keyword arguments (``env.kwargs``): ``width``, ``height``, ``resize``, ``frame_skip``,
``variables``, ``screen_resolution`` (a ViZDoom ``ScreenResolution`` such as ``RES_160X120``). Training and
evaluation use the same env. The engine starts at the first ``reset``, so an env made only for its spaces
(``envs.env_spec``) costs no game.

Imports ``vizdoom`` only when an env is made (``pip install 'lockstep[vizdoom]'``), and never torch.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import gymnasium as gym
import numpy as np

from lockstep.envs.atari import AreaResize

# the single-player scenarios that ship inside the vizdoom package (vizdoom.scenarios_path)
SCENARIOS = ("basic", "simpler_basic", "rocket_basic", "defend_the_center", "defend_the_line", "health_gathering",
             "health_gathering_supreme", "deadly_corridor", "my_way_home", "predict_position", "take_cover")
VARIABLES_BY_DEFAULT = ("health_gathering", "health_gathering_supreme")  # a Dict with the game variables by default
RESIZES = ("nearest", "area")
INSTALL = "pip install 'lockstep[vizdoom]' (in a checkout: pip install -e '.[vizdoom]')"


def _vizdoom():
    try:
        import vizdoom
    except ImportError as err:
        raise ValueError(f"VizDoom env ids need ViZDoom: {INSTALL} ({err})") from err
    return vizdoom


def scenario_config(scenario: str) -> str:
    """The ``.cfg`` file of ``scenario``: a path of the user's (it ends in ``.cfg`` or names a folder), which must
    exist, or a scenario that ships with ViZDoom; else a ValueError that lists the scenarios."""
    if scenario.endswith(".cfg") or os.sep in scenario:
        if not os.path.isfile(scenario):
            raise ValueError(f"VizDoom scenario file {scenario!r} (env id 'vizdoom:{scenario}') does not exist "
                             f"(from {os.getcwd()}): a scenario of your own is the path of its .cfg file, which "
                             "the learner's host and every actor's host must have")
        return os.path.abspath(scenario)
    if scenario not in SCENARIOS:
        close = difflib.get_close_matches(scenario, SCENARIOS, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        if scenario.startswith("Vizdoom"):
            hint += f"(ViZDoom's own Gymnasium ids are vizdoom.gymnasium_wrapper:{scenario}) "
        raise ValueError(f"unknown VizDoom scenario {scenario!r} in env id 'vizdoom:{scenario}': {hint}the scenarios "
                         f"are {', '.join(SCENARIOS)}, or the path of a .cfg file of your own "
                         "(vizdoom:/path/to/my.cfg)")
    return os.path.join(_vizdoom().scenarios_path, f"{scenario}.cfg")


class NearestResize:
    """Shrink frames [C, H, W] to [C, height, width] by taking pixel ``floor(i * H / height)`` of each row and
    ``floor(j * W / width)`` of each column (OpenCV's INTER_NEAREST), one ``take`` of the flattened frame."""

    def __init__(self, size_in: tuple[int, int], size_out: tuple[int, int]) -> None:
        rows = np.arange(size_out[0]) * size_in[0] // size_out[0]
        cols = np.arange(size_out[1]) * size_in[1] // size_out[1]
        self.pixels = (rows[:, None] * size_in[1] + cols[None, :]).ravel()
        self.size_out = size_out

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        return frame.reshape(frame.shape[0], -1).take(self.pixels, axis=1).reshape(frame.shape[0], *self.size_out)


class VizDoomEnv(gym.Env):
    """One ViZDoom game as a Gymnasium env (module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, scenario: str, width: int = 128, height: int = 72, resize: str = "nearest", frame_skip: int = 4,
                 variables: bool | None = None, screen_resolution: str = "RES_160X120",
                 render_mode: str | None = None) -> None:
        config = scenario_config(scenario)
        vizdoom = _vizdoom()
        if int(frame_skip) < 1:
            raise ValueError(f"vizdoom:{scenario}: frame_skip must be at least 1, got {frame_skip}")
        if resize not in RESIZES:
            raise ValueError(f"vizdoom:{scenario}: resize must be one of {', '.join(RESIZES)}, got {resize!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"vizdoom:{scenario}: render_mode must be rgb_array or None, got {render_mode!r}")
        self.scenario, self.frame_skip, self.render_mode = scenario, int(frame_skip), render_mode
        resolution = str(screen_resolution).upper()
        resolution = resolution if resolution.startswith("RES_") else f"RES_{resolution}"
        if not hasattr(vizdoom.ScreenResolution, resolution):
            raise ValueError(f"vizdoom:{scenario}: screen_resolution {screen_resolution!r} is not one of ViZDoom's "
                             "ScreenResolution names (e.g. RES_160X120, RES_320X240)")
        self.game = game = vizdoom.DoomGame()
        try:
            game.load_config(config)
            wad = game.get_doom_scenario_path()  # resolved against the .cfg's folder; ViZDoom would fail at init
            if wad and not os.path.isfile(wad):
                raise ValueError(f"vizdoom:{scenario}: the scenario's doom_scenario_path {wad} does not exist (a "
                                 "relative one is taken from the .cfg file's folder)")
            game.set_window_visible(False)
            game.set_sound_enabled(False)
            game.set_mode(vizdoom.Mode.PLAYER)
            game.set_screen_format(vizdoom.ScreenFormat.CRCGCB)  # [3, H, W]: channels first already
            game.set_screen_resolution(getattr(vizdoom.ScreenResolution, resolution))
            self._set_spaces(vizdoom, game, (int(height), int(width)), resize, variables)
        except BaseException:
            game.close()
            raise
        self._frame: Any = None  # the last observation: an episode's last step repeats it

    def _set_spaces(self, vizdoom, game, size: tuple[int, int], resize: str, variables: bool | None) -> None:
        buttons = game.get_available_buttons()
        delta = [button.name for button in buttons if vizdoom.is_delta_button(button)]
        if delta:
            raise ValueError(f"vizdoom:{self.scenario}: the delta buttons {', '.join(delta)} take a number, and "
                             "lockstep's VizDoom actions press one binary button at a time: list binary buttons "
                             "(e.g. TURN_LEFT, TURN_RIGHT) under available_buttons")
        if not buttons:
            raise ValueError(f"vizdoom:{self.scenario}: the scenario has no available_buttons to press")
        self.action_names = ("NOOP", *(button.name for button in buttons))
        self.buttons = [[0] * len(buttons)] + [[int(i == j) for j in range(len(buttons))] for i in range(len(buttons))]
        self.action_space = gym.spaces.Discrete(len(self.action_names))
        native = (game.get_screen_height(), game.get_screen_width())
        if not (0 < size[0] <= native[0] and 0 < size[1] <= native[1]):
            raise ValueError(f"vizdoom:{self.scenario}: width x height {size[1]} x {size[0]} must be at least 1 x 1 "
                             f"and at most the screen_resolution, {native[1]} x {native[0]} (frames are only shrunk)")
        shrink = NearestResize if resize == "nearest" else AreaResize
        self.resize = shrink(native, size) if size != native else None
        screen = gym.spaces.Box(0, 255, (3, *size), np.uint8)
        self.variable_names = tuple(variable.name for variable in game.get_available_game_variables())
        self.variables = self.scenario in VARIABLES_BY_DEFAULT if variables is None else bool(variables)
        if self.variables and not self.variable_names:
            raise ValueError(f"vizdoom:{self.scenario}: variables is on, but the scenario has no "
                             "available_game_variables")
        values = gym.spaces.Box(-np.inf, np.inf, (len(self.variable_names),), np.float32)
        self.observation_space = gym.spaces.Dict({"screen": screen, "vars": values}) if self.variables else screen

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.game.set_seed(int(seed) % 2**32)  # ViZDoom's seeds are unsigned 32-bit
        if self.game.is_running():
            self.game.new_episode()
        else:
            self.game.init()  # the engine starts here, not when the env is made (module docstring)
        return self._observation(), {}

    def step(self, action) -> tuple[Any, float, bool, bool, dict]:
        reward = self.game.make_action(self.buttons[int(action)], self.frame_skip)
        if not self.game.is_episode_finished():
            return self._observation(), float(reward), False, False, {}
        truncated = self.game.is_episode_timeout_reached()
        return self._frame, float(reward), not truncated, truncated, {}

    def _observation(self) -> Any:
        state = self.game.get_state()
        self._screen = state.screen_buffer  # [3, H, W] at the native resolution
        screen = self.resize(self._screen) if self.resize is not None else self._screen.copy()
        if self.variables:
            screen = {"screen": screen, "vars": np.asarray(state.game_variables, np.float32)}
        self._frame = screen
        return screen

    def render(self) -> np.ndarray | None:
        """The last frame at the native resolution, [H, W, 3] (``render_mode="rgb_array"``)."""
        if self.render_mode != "rgb_array" or self._frame is None:
            return None
        return np.ascontiguousarray(self._screen.transpose(1, 2, 0))

    def close(self) -> None:
        self.game.close()


def make_vizdoom(scenario: str, training: bool = True, **kwargs) -> gym.Env:
    """The env of ``vizdoom:SCENARIO``: ``VizDoomEnv(scenario, **kwargs)`` (module docstring). ``training``
    changes nothing: VizDoom is trained and evaluated on the same env. An unknown keyword is a ValueError that
    names the settings."""
    known = ("width", "height", "resize", "frame_skip", "variables", "screen_resolution", "render_mode")
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(f"vizdoom:{scenario} takes no {', '.join(unknown)} (env.kwargs); its settings are "
                         f"{', '.join(known)}")
    return VizDoomEnv(scenario, **kwargs)
