import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.kafka.listener.KafkaMessageListenerContainer;
import org.springframework.kafka.requestreply.ReplyingKafkaTemplate;
import org.springframework.kafka.requestreply.RequestReplyFuture;
import org.springframework.kafka.support.TopicPartitionOffset;

/**
 * A caller as a Spring Kafka service writes one: a ReplyingKafkaTemplate sends each request to the worker's input
 * topic (Spring sets kafka_replyTopic, kafka_replyPartition when its reply container has one partition assigned,
 * and kafka_correlationId itself) and waits for the reply it correlates. The error checker turns a dead-lettered
 * request's reply (it carries stream.dlq.stage) into an exception.
 *
 * Arguments: bootstrap input-topic reply-topic requests-file (one request a line: base64 key, a space, base64
 * value) [--partition N: the reply container reads that partition only (Spring sends kafka_replyPartition); else
 * it joins a group on the whole topic] [--read-committed] [--timeout-s S].
 * Prints one JSON line a request, in order: {"index", "value" (base64), "headers" {name: base64}, "sent_correlation"
 * (base64: what Spring put on the request), "sent_reply_partition" (whether it sent one)} or {"index", "error"},
 * then {"done": n}.
 */
public final class ReplyingCaller {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], input = args[1], replyTopic = args[2];
        List<String> lines = Files.readAllLines(Path.of(args[3]));
        Integer partition = null;
        boolean readCommitted = false;
        long timeoutS = 60;
        for (int i = 4; i < args.length; i++) {
            switch (args[i]) {
                case "--partition" -> partition = Integer.parseInt(args[++i]);
                case "--read-committed" -> readCommitted = true;
                case "--timeout-s" -> timeoutS = Long.parseLong(args[++i]);
                default -> throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        Map<String, Object> producerProps = new HashMap<>();
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerProps.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        producerProps.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        Map<String, Object> consumerProps = new HashMap<>();
        consumerProps.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, "replying-caller-" + ProcessHandle.current().pid());
        // From the start of the reply topic (the test's own): a reply cannot land before the container's position
        // is set and be skipped; replies to an earlier caller's requests are not this template's and are dropped.
        consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerProps.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        consumerProps.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        if (readCommitted) {
            consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        }
        ContainerProperties containerProps = partition == null
                ? new ContainerProperties(replyTopic)
                : new ContainerProperties(new TopicPartitionOffset(replyTopic, partition));
        KafkaMessageListenerContainer<byte[], byte[]> replies = new KafkaMessageListenerContainer<>(
                new DefaultKafkaConsumerFactory<>(consumerProps), containerProps);
        ReplyingKafkaTemplate<byte[], byte[], byte[]> template = new ReplyingKafkaTemplate<>(
                new DefaultKafkaProducerFactory<>(producerProps), replies);
        template.setDefaultReplyTimeout(Duration.ofSeconds(timeoutS));
        // The check a caller of the worker adds: a reply that carries stream.dlq.stage is a dead letter.
        template.setReplyErrorChecker(record -> {
            Header stage = record.headers().lastHeader("stream.dlq.stage");
            if (stage == null) {
                return null;
            }
            Header reason = record.headers().lastHeader("stream.dlq.error.reason");
            return new IllegalStateException("dead-lettered at " + new String(stage.value(), StandardCharsets.UTF_8)
                    + (reason == null ? "" : ": " + new String(reason.value(), StandardCharsets.UTF_8)));
        });
        template.start();
        try {
            if (!template.waitForAssignment(Duration.ofSeconds(60))) {
                throw new IllegalStateException("the reply container got no partition of " + replyTopic);
            }
            System.err.println("reply container assigned: " + replies.getAssignedPartitions());
            Base64.Decoder b64 = Base64.getDecoder();
            List<RequestReplyFuture<byte[], byte[], byte[]>> futures = new ArrayList<>();
            for (String line : lines) {
                String[] parts = line.split(" ", 2);
                byte[] key = parts[0].isEmpty() ? null : b64.decode(parts[0]);
                futures.add(template.sendAndReceive(new ProducerRecord<>(input, key, b64.decode(parts[1]))));
            }
            System.err.println("sent " + futures.size() + " requests");
            Base64.Encoder enc = Base64.getEncoder();
            for (int i = 0; i < futures.size(); i++) {
                StringBuilder out = new StringBuilder("{\"index\": ").append(i);
                try {
                    ConsumerRecord<byte[], byte[]> reply = futures.get(i).get(timeoutS + 5, TimeUnit.SECONDS);
                    out.append(", \"value\": \"").append(enc.encodeToString(reply.value())).append("\", \"headers\": {");
                    String sep = "";
                    for (Header h : reply.headers()) {
                        out.append(sep).append('"').append(h.key()).append("\": \"")
                                .append(h.value() == null ? "" : enc.encodeToString(h.value())).append('"');
                        sep = ", ";
                    }
                    out.append('}');
                    Header sent = futures.get(i).getSendFuture().get().getProducerRecord().headers()
                            .lastHeader("kafka_correlationId");
                    out.append(", \"sent_correlation\": \"").append(enc.encodeToString(sent.value())).append('"');
                    Header sentPartition = futures.get(i).getSendFuture().get().getProducerRecord().headers()
                            .lastHeader("kafka_replyPartition");
                    out.append(", \"sent_reply_partition\": ").append(sentPartition != null);
                } catch (ExecutionException e) {
                    Throwable cause = e.getCause() == null ? e : e.getCause();
                    out.append(", \"error\": \"").append(cause.getClass().getSimpleName()).append(": ")
                            .append(String.valueOf(cause.getMessage()).replace("\\", "\\\\").replace("\"", "'"))
                            .append('"');
                }
                System.out.println(out.append('}'));
            }
            System.out.println("{\"done\": " + futures.size() + "}");
        } finally {
            template.stop();
        }
        System.exit(0);
    }
}
