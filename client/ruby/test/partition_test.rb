# frozen_string_literal: true

require_relative "test_helper"

# Jobbroker::Partition against every line of tests/client/partition_vectors.tsv, the file the
# broker's own tests check against core/ids.cc: the client places queues and job ids exactly
# where the broker does.
class PartitionTest < Minitest::Test
  VECTORS = File.expand_path("../../../tests/client/partition_vectors.tsv", __dir__)

  def vectors(kind)
    File.readlines(VECTORS, chomp: true, encoding: "UTF-8")
        .reject { |line| line.start_with?("#") || line.empty? }
        .map { |line| line.split("\t", -1) }
        .select { |fields| fields.first == kind }
  end

  def test_every_queue_vector_is_placed_as_the_broker_places_it
    lines = vectors("queue")
    refute_empty lines
    lines.each do |_, name, count, partition|
      assert_equal Integer(partition), Jobbroker::Partition.of_queue(name, Integer(count)),
                   "queue #{name.inspect} of #{count} partitions"
    end
  end

  def test_every_job_id_vector_is_placed_as_the_broker_places_it
    lines = vectors("job")
    refute_empty lines
    lines.each do |_, id, count, partition|
      want = partition == "none" ? nil : Integer(partition)
      got = Jobbroker::Partition.of_job_id(id, Integer(count))
      assert want.nil? ? got.nil? : want == got,
             "job id #{id.inspect} of #{count} partitions: #{got.inspect}, not #{partition}"
    end
  end

  def test_the_vectors_cover_both_kinds_and_ids_of_no_known_form
    assert_equal 4, vectors("queue").map(&:size).uniq.first
    assert(vectors("job").any? { |fields| fields[3] == "none" })
    assert(vectors("job").any? { |fields| fields[3] != "none" })
  end

  def test_a_queue_name_in_another_encoding_hashes_its_utf8_bytes
    name = "Ünïcödé"
    assert_equal Jobbroker::Partition.of_queue(name, 64),
                 Jobbroker::Partition.of_queue(name.encode(Encoding::UTF_16LE), 64)
  end
end
