# frozen_string_literal: true

module Jobbroker
  # Where a queue and a job live in a cluster of `count` partitions, computed by the client so
  # that it can send a call straight to the partition's leader.
  #
  # Both functions must answer exactly what the broker answers (core/ids.cc places queues and
  # names job ids by them); the gem links no broker code, so they are written again here and
  # tested against every line of tests/client/partition_vectors.tsv, which the broker's own
  # tests check against core.
  module Partition
    FNV_OFFSET_BASIS = 0xcbf29ce484222325
    FNV_PRIME = 0x100000001b3
    UINT64_MASK = 0xffff_ffff_ffff_ffff
    # The broker's job ids: 26 digits of Crockford base32, upper case (no I, L, O, U).
    JOB_ID_DIGITS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    JOB_ID_LENGTH = 26
    # Digits 10 to 12 of a job id hold its partition, 5 bits each, most significant first.
    PARTITION_DIGITS = (10..12)

    # FNV-1a (64 bits) of the queue name's UTF-8 bytes, modulo `count`; 0 when `count` <= 1.
    def self.of_queue(queue, count)
      return 0 if count <= 1

      hash = FNV_OFFSET_BASIS
      utf8_bytes(queue.to_s).each_byte { |byte| hash = ((hash ^ byte) * FNV_PRIME) & UINT64_MASK }
      hash % count
    end

    # The partition field of a job id modulo `count` (0 when `count` <= 1); nil unless `job_id`
    # has the broker's form: 26 digits of JOB_ID_DIGITS, the first below '8' (26 digits carry
    # 130 bits, of which the top 2 are zero).
    def self.of_job_id(job_id, count)
      id = job_id.to_s
      return nil unless id.bytesize == JOB_ID_LENGTH

      field = 0
      id.each_byte.with_index do |byte, i|
        value = JOB_ID_DIGITS.index(byte.chr)
        return nil if value.nil? || (i.zero? && value >= 8)

        field = (field << 5) | value if PARTITION_DIGITS.cover?(i)
      end
      count <= 1 ? 0 : field % count
    end

    # The bytes the broker hashes: the name as the request carries it, in UTF-8.
    def self.utf8_bytes(text)
      return text if text.encoding == Encoding::UTF_8 || text.encoding == Encoding::BINARY

      text.encode(Encoding::UTF_8)
    end
    private_class_method :utf8_bytes
  end
end
