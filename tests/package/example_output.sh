# check_training_output FILE: FILE is what examples/train_linear.cpp printed, lines of
# "step N  loss L". Passes when there are at least 5 of them, the steps rise, every loss
# is finite and below the one before, and the last is under half the first: training
# that learns. Sourced by check.sh and library_example_test.sh.
check_training_output() {
  awk '
    $1 != "step" || $3 != "loss" || NF != 4 { print "unexpected line: " $0; bad = 1; next }
    {
      step = $2 + 0; loss = $4 + 0
      if ($4 !~ /^[0-9]+\.[0-9]+$/) { print "loss is not a finite number: " $0; bad = 1 }
      if (n > 0 && step <= last_step) { print "steps do not rise: " $0; bad = 1 }
      if (n > 0 && loss >= last_loss) { print "loss did not decrease: " $0; bad = 1 }
      if (n == 0) first_loss = loss
      last_step = step; last_loss = loss; n++
    }
    END {
      if (n < 5) { print "expected at least 5 lines of loss, got " n; bad = 1 }
      else if (last_loss >= first_loss / 2) {
        print "the loss fell only from " first_loss " to " last_loss; bad = 1
      }
      exit bad
    }' "$1"
}
