#pragma once
// One training step's figures as the examples log them (common/record.hpp
// writes them on the device; a program's main tabulates them).

namespace examples {

struct StepFigures {
  float loss, scale;
  long long skipped;
  int first_nonfinite;  // --numerics: the parameter where backward met an inf/NaN first (-1: none, or off)
};

}  // namespace examples
