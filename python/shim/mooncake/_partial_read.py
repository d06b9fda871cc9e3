# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""``mooncake._partial_read`` (a private Mooncake module) served by Larder: see
larder.compat.mooncake._partial_read."""

from larder.compat.mooncake._partial_read import MatrixReadPlan, plan_matrix_read

__all__ = ["MatrixReadPlan", "plan_matrix_read"]
