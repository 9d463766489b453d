# frozen_string_literal: true

require_relative "test_helper"

# The decoding rules of jobbroker.v1.StepCheckpoint (proto/jobbroker/v1/steps.proto), the same
# in every language's helper. No broker needed.
class StepCheckpointTest < Minitest::Test
  V1 = Jobbroker::V1

  def encode(*steps)
    V1::StepCheckpoint.encode(V1::StepCheckpoint.new(
      steps: steps.map { |name, result| V1::CompletedStep.new(name: name, result: result.b) }
    ))
  end

  def decode(data)
    Jobbroker::JobContext.decode_step_checkpoint(data.b)
  end

  def test_an_empty_checkpoint_holds_no_finished_step
    _, results = decode("")
    assert_empty results
  end

  def test_results_are_kept_by_name_in_order
    checkpoint, results = decode(encode(["a", "1"], ["b", '{"x":[true,null]}']))
    assert_equal %w[a b], checkpoint.steps.map(&:name)
    assert_equal({ "a" => "1", "b" => '{"x":[true,null]}' }, results)
  end

  def test_fields_a_newer_helper_adds_are_ignored
    # Field 9 as a varint (tag 9 << 3 | 0 = 0x48, value 1): unknown to this version.
    _, results = decode("#{encode(['a', '"x"'])}\x48\x01".b)
    assert_equal({ "a" => '"x"' }, results)
  end

  def test_bytes_that_are_not_a_checkpoint_are_refused
    assert_raises(Jobbroker::StepCheckpointError) { decode("\xFF\xFF\xFF") }
  end

  def test_a_checkpoint_without_steps_is_refused
    # A well-formed message of unknown fields only: parses, but durable steps did not write it.
    err = assert_raises(Jobbroker::StepCheckpointError) { decode("\x48\x01") }
    assert_match(/no step/, err.message)
  end

  def test_a_repeated_or_empty_step_name_is_refused
    assert_raises(Jobbroker::StepCheckpointError) { decode(encode(%w[a 1], %w[a 2])) }
    assert_raises(Jobbroker::StepCheckpointError) { decode(encode(["", "1"])) }
  end

  def test_a_result_that_is_not_json_is_refused
    err = assert_raises(Jobbroker::StepCheckpointError) { decode(encode(["a", "not json"])) }
    assert_match(/"a"/, err.message)
    assert_raises(Jobbroker::StepCheckpointError) { decode(encode(["a", "\"\xFF\""])) }
  end
end
